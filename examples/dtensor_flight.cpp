// dtensor-flight: reads the flight records every rank of a job dumped
// (DTENSOR_FLIGHT_RECORDER=DIR, dtensor/flight_recorder.h) and names the first call on
// which the ranks disagree, the rank that never arrived, the message no peer posted.
//
//   DTENSOR_FLIGHT_RECORDER=/tmp/fr mpirun -np 8 train_gpt --backend mpi ...   # hangs, times out
//   dtensor-flight /tmp/fr
//
// Exit status: 0 when the records agree, 1 when they name a problem, 2 on bad input.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "dtensor/flight_recorder.h"

int main(int argc, char** argv) {
  if (argc != 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fprintf(argc == 2 ? stdout : stderr,
                 "usage: dtensor-flight DIR\n"
                 "  DIR: the directory DTENSOR_FLIGHT_RECORDER named (rank-<k>.json of each rank)\n"
                 "  exit 0: the records agree; 1: they name a problem (printed); 2: bad input\n");
    return argc == 2 ? 0 : 2;
  }
  try {
    const dtensor::FlightAnalysis analysis = dtensor::analyze_flight_records(argv[1]);
    std::fputs(analysis.report().c_str(), stdout);
    return analysis.consistent() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtensor-flight: %s\n", e.what());
    return 2;
  }
}
