// The cohort command line: the library's built-in tasks and models.
#include "cohort/cli.hpp"

int main(int argc, char** argv) { return cohort::cli_main(argc, argv); }
