// Links against an installed dtensor and checks one real computation and the version.
#include <dtensor/dtensor.h>

#include <cstdio>
#include <cstring>

int main() {
  using namespace dtensor;
  if (std::strcmp(version(), DTENSOR_VERSION_STRING) != 0) {
    std::fprintf(stderr, "consumer: headers of dtensor %s, library %s\n", DTENSOR_VERSION_STRING, version());
    return 1;
  }
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  Tensor b = matmul(a, a);  // [[7, 10], [15, 22]]
  std::vector<float> got = b.to_vector<float>();
  std::vector<float> want{7, 10, 15, 22};
  if (got != want) {
    std::fprintf(stderr, "consumer: wrong matmul result %s\n", b.to_string().c_str());
    return 1;
  }
  std::printf("consumer: dtensor %s ok %s\n", version(), b.to_string().c_str());
  return 0;
}
