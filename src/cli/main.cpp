#include <cstdio>

int main() {
  std::puts("bie: under construction");
  return 0;
}
