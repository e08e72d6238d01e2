// trainflow: the single binary. Only main() turns errors into exit codes (see engine/cli.h).
#include "engine/cli.h"

int main(int argc, char** argv) { return tf::RunCli(argc, argv); }
