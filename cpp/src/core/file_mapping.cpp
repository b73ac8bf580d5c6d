#include "core/file_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace revolta {

MappedFile::~MappedFile() {
  if (data && size > 0) munmap(const_cast<char*>(data), size);
}

std::shared_ptr<MappedFile> map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  RV_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  auto map = std::make_shared<MappedFile>();
  map->size = size_t(st.st_size);
  void* addr = map->size > 0 ? ::mmap(nullptr, map->size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  ::close(fd);
  RV_CHECK(addr != MAP_FAILED, "cannot map ", path);
  map->data = static_cast<const char*>(addr);
  return map;
}

}  // namespace revolta
