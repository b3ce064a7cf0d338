// `entente`: the one executable (see broker/cli.h for its commands).
#include "broker/cli.h"

int main(int argc, char** argv) { return entente::broker::run_cli(argc, argv); }
