// Entry point of the mptrain binary; everything happens in mpt::app::run.
#include "app/cli.hpp"

int main(int argc, char** argv) { return mpt::app::run(argc, argv); }
