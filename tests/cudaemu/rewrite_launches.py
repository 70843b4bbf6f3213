#!/usr/bin/env python3
"""Turns a .cu file of mptrain into host C++ for the CUDA emulator (docs/testing.md).

Every launch KERNEL<<<CONFIG>>>(ARGS) becomes
    ::mpt::cudaemu::launch("KERNEL", ::mpt::cudaemu::LaunchConfig(CONFIG),
                           [](auto... a) { KERNEL(a...); }, ARGS)
and the file starts with tests/cudaemu/device.hpp and a #line back to the source, so that the
compiler's messages name the .cu file's lines. Nothing else changes: the emulator compiles the
very source that nvcc compiles. Usage: rewrite_launches.py INPUT.cu OUTPUT.cpp
"""
import os
import re
import sys

IDENT = re.compile(r"[A-Za-z0-9_:]")


def matching(text, start, open_char, close_char):
    """Index just past the bracket that closes the one at START."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c in "\"'":  # skip a string or character literal
            i += 1
            while text[i] != c:
                i += 2 if text[i] == "\\" else 1
        elif c == open_char:
            depth += 1
        elif c == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise SystemExit(f"rewrite_launches.py: unbalanced '{open_char}' from offset {start}")


def kernel_start(text, end):
    """Where the kernel's name (with template arguments) ends at END begins."""
    i = end
    while i > 0 and text[i - 1].isspace():
        i -= 1
    if text[i - 1] == ">":  # explicit template arguments
        depth = 0
        while True:
            i -= 1
            if text[i] == ">":
                depth += 1
            elif text[i] == "<":
                depth -= 1
                if depth == 0:
                    break
    while i > 0 and IDENT.match(text[i - 1]):
        i -= 1
    return i


def rewrite(text, path):
    out = []
    pos = 0
    while True:
        at = text.find("<<<", pos)
        if at < 0:
            out.append(text[pos:])
            return "".join(out)
        start = kernel_start(text, at)
        name = text[start:at].strip()
        config_end = text.find(">>>", at)
        config = text[at + 3:config_end].strip()
        paren = config_end + 3
        while text[paren].isspace():
            paren += 1
        if text[paren] != "(":
            line = text.count("\n", 0, at) + 1
            raise SystemExit(f"{path}:{line}: a launch without an argument list")
        args_end = matching(text, paren, "(", ")")
        args = text[paren + 1:args_end - 1].strip()
        out.append(text[pos:start])
        out.append(f'::mpt::cudaemu::launch("{name}", ::mpt::cudaemu::LaunchConfig({config}), '
                   f"[](auto... cudaemu_args) {{ {name}(cudaemu_args...); }}{', ' + args if args else ''})")
        pos = args_end


def main():
    source, target = sys.argv[1], sys.argv[2]
    with open(source, encoding="utf-8") as f:
        text = f.read()
    body = rewrite(text, source)
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    with open(target, "w", encoding="utf-8") as f:
        f.write('#include "tests/cudaemu/device.hpp"\n')
        f.write(f'#line 1 "{source}"\n')
        f.write(body)


if __name__ == "__main__":
    main()
