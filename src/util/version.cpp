#include "dtensor/version.h"

namespace dtensor {

const char* version() { return DTENSOR_VERSION_STRING; }

}  // namespace dtensor
