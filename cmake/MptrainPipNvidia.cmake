# mpt_pip_nvidia_roots(OUT): the <site-packages>/nvidia folders of the Python on PATH, where pip
# installs nvidia-cudnn-cu*, nvidia-nccl-cu*, nvidia-cublas-cu* (each as nvidia/<lib>/{include,lib}).
# PyTorch wheels bring these, so a GPU machine with only torch and the toolkit has them here.
function(mpt_pip_nvidia_roots out)
  if(DEFINED MPT_PIP_NVIDIA_ROOTS_CACHED)
    set(${out} "${MPT_PIP_NVIDIA_ROOTS_CACHED}" PARENT_SCOPE)
    return()
  endif()
  find_program(MPT_PYTHON3 NAMES python3 python)
  set(roots "")
  if(MPT_PYTHON3)
    execute_process(
      COMMAND ${MPT_PYTHON3} -c
        "import site, sysconfig; print(';'.join(site.getsitepackages() + [site.getusersitepackages(), sysconfig.get_paths()['purelib']]))"
      OUTPUT_VARIABLE sites OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0)
      foreach(site IN LISTS sites)
        if(IS_DIRECTORY "${site}/nvidia")
          list(APPEND roots "${site}/nvidia")
        endif()
      endforeach()
      list(REMOVE_DUPLICATES roots)
    endif()
  endif()
  set(MPT_PIP_NVIDIA_ROOTS_CACHED "${roots}" CACHE INTERNAL "pip nvidia package folders")
  set(${out} "${roots}" PARENT_SCOPE)
endfunction()

# mpt_find_nvidia_library(PREFIX HEADER LIBNAME PIPDIR): sets PREFIX_INCLUDE_DIR and
# PREFIX_LIBRARY from PREFIX_ROOT / $ENV{PREFIX_ROOT}, the CUDA toolkit, the system, or
# <site-packages>/nvidia/PIPDIR. Pip wheels ship only versioned libraries (libnccl.so.2), so
# those names are searched too.
function(mpt_find_nvidia_library prefix header libname pipdir)
  mpt_pip_nvidia_roots(pip_roots)
  set(hints ${${prefix}_ROOT} $ENV{${prefix}_ROOT} ${CUDAToolkit_LIBRARY_ROOT}
            ${CUDAToolkit_TARGET_DIR})
  set(pip_hints "")
  foreach(root IN LISTS pip_roots)
    list(APPEND pip_hints "${root}/${pipdir}")
  endforeach()
  find_path(${prefix}_INCLUDE_DIR ${header}
            HINTS ${hints} ${CUDAToolkit_INCLUDE_DIRS} PATHS ${pip_hints}
            PATH_SUFFIXES include)
  set(names ${libname})
  foreach(version 2 9 8 13 12)
    list(APPEND names lib${libname}.so.${version})
  endforeach()
  find_library(${prefix}_LIBRARY NAMES ${names}
               HINTS ${hints} ${CUDAToolkit_LIBRARY_DIR} PATHS ${pip_hints}
               PATH_SUFFIXES lib lib64 lib/x64)
endfunction()
