// braid: collective communication over shared memory, TCP and more.
#pragma once

#include "braid/communicator.h"
#include "braid/config.h"
#include "braid/error.h"
#include "braid/memory.h"
#include "braid/types.h"
#include "braid/version.h"
