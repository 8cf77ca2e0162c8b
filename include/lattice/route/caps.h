// Device capabilities live in the core vocabulary (the backends report them without reaching the
// route layer); this header keeps the route-layer spelling.
#pragma once

#include "lattice/core/caps.h"
