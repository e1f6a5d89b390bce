// rdmaxx-copy's two sides. Each returns the process's exit status.
#pragma once

#include "options.hpp"

namespace rdmaxx::copy {

int serve(const Options& options);
int send_files(const Options& options);

} // namespace rdmaxx::copy
