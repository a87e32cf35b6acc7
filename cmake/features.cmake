# BRAID_CUDA, BRAID_UCX, BRAID_IBVERBS: AUTO uses what is found, ON requires
# it, OFF skips it. Each resolved choice is printed once and becomes a
# BRAID_HAVE_<NAME>=0|1 definition that braid-info reports. CUDA builds
# the CUDA device (src/device/cuda), UCX the ucx transport (transports/ucx:
# UCX's headers at build time; libbraid loads libucp at run time, when a
# communicator first takes ucx); IBVERBS the ibverbs transport
# (transports/ibverbs: the headers at build time; libibverbs is loaded at run
# time, and the transport also runs over the tests' fake fabric); TLS
# encrypts braid's TCP sockets when a key is set (OpenSSL 3, libssl-dev:
# linked, as it is on every Debian system).
set(BRAID_CUDA AUTO CACHE STRING "CUDA support: AUTO, ON or OFF")
set(BRAID_UCX AUTO CACHE STRING "UCX transport: AUTO, ON or OFF")
set(BRAID_IBVERBS AUTO CACHE STRING "InfiniBand verbs transport: AUTO, ON or OFF")
set(BRAID_TLS AUTO CACHE STRING "TLS for braid's TCP sockets (OpenSSL 3): AUTO, ON or OFF")
foreach(opt BRAID_CUDA BRAID_UCX BRAID_IBVERBS BRAID_TLS)
  set_property(CACHE ${opt} PROPERTY STRINGS AUTO ON OFF)
  if(NOT ${opt} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${opt} must be AUTO, ON or OFF, not '${${opt}}'")
  endif()
endforeach()

function(braid_resolve_feature opt found what)
  if(${opt} STREQUAL "OFF")
    set(result 0)
    message(STATUS "braid: ${opt}=OFF: ${what} not built")
  elseif(found)
    set(result 1)
    if(opt STREQUAL "BRAID_CUDA")
      message(STATUS "braid: ${opt}=${${opt}}: ${what} found: building the CUDA device")
    elseif(opt STREQUAL "BRAID_TLS")
      message(STATUS "braid: ${opt}=${${opt}}: ${what} found: sockets can carry TLS")
    elseif(opt STREQUAL "BRAID_UCX")
      message(STATUS "braid: ${opt}=${${opt}}: ${what} found: building the ucx transport "
        "(libucp loaded at run time)")
    else()
      message(STATUS "braid: ${opt}=${${opt}}: ${what} found: building the ibverbs transport "
        "(libibverbs loaded at run time)")
    endif()
  elseif(${opt} STREQUAL "ON")
    message(FATAL_ERROR "braid: ${opt}=ON but ${what} was not found")
  else()
    set(result 0)
    message(STATUS "braid: ${opt}=AUTO: ${what} not found, not built")
  endif()
  set(${opt}_ENABLED ${result} PARENT_SCOPE)
endfunction()

set(_cuda_found FALSE)
if(NOT BRAID_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  set(_cuda_found ${CUDAToolkit_FOUND})
endif()
braid_resolve_feature(BRAID_CUDA "${_cuda_found}" "the CUDA toolkit")

set(_ucx_found FALSE)
if(NOT BRAID_UCX STREQUAL "OFF")
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(UCX QUIET ucx)
    if(UCX_FOUND)
      find_path(BRAID_UCX_INCLUDE_DIR ucp/api/ucp.h HINTS ${UCX_INCLUDE_DIRS})
      if(BRAID_UCX_INCLUDE_DIR)
        set(_ucx_found TRUE)
      endif()
    endif()
  endif()
endif()
braid_resolve_feature(BRAID_UCX "${_ucx_found}" "UCX (libucx-dev)")

set(_verbs_found FALSE)
if(NOT BRAID_IBVERBS STREQUAL "OFF")
  find_library(IBVERBS_LIBRARY ibverbs)
  find_path(IBVERBS_INCLUDE_DIR infiniband/verbs.h)
  if(IBVERBS_LIBRARY AND IBVERBS_INCLUDE_DIR)
    set(_verbs_found TRUE)
  endif()
endif()
braid_resolve_feature(BRAID_IBVERBS "${_verbs_found}" "libibverbs (libibverbs-dev)")

set(_tls_found FALSE)
if(NOT BRAID_TLS STREQUAL "OFF")
  find_package(OpenSSL 3 QUIET)
  set(_tls_found ${OpenSSL_FOUND})
endif()
braid_resolve_feature(BRAID_TLS "${_tls_found}" "OpenSSL 3 (libssl-dev)")

set(BRAID_FEATURE_DEFINITIONS
  BRAID_HAVE_CUDA=${BRAID_CUDA_ENABLED}
  BRAID_HAVE_UCX=${BRAID_UCX_ENABLED}
  BRAID_HAVE_IBVERBS=${BRAID_IBVERBS_ENABLED}
  BRAID_HAVE_TLS=${BRAID_TLS_ENABLED})
