// lattice: sparse voxel tensors for point clouds. Umbrella header of the public C++ API.
#pragma once

#include "lattice/core/array.h"
#include "lattice/core/dtype.h"
#include "lattice/core/error.h"
#include "lattice/core/vocab.h"
#include "lattice/ops/conv.h"
#include "lattice/ops/diagnostics.h"
#include "lattice/ops/quantize.h"
#include "lattice/route/caps.h"
#include "lattice/route/route.h"
#include "lattice/tensor/coordinate_set.h"
#include "lattice/tensor/relation.h"
#include "lattice/tensor/sparse_tensor.h"
