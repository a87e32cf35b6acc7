# braid_add_transport(<target> <sources>...): a transport's object library,
# which libbraid takes in. Each folder under transports/ with a
# CMakeLists.txt is a transport (the top-level CMakeLists.txt finds them
# by glob); its CMakeLists.txt returns early where its CMake option or its
# library leaves it out, and otherwise calls this once per object library.
# The transport table (transports/table.cc) is the only code that sees
# them. Defines the include directories every transport uses; add a
# library's own with target_include_directories(<target> SYSTEM PRIVATE ...).
function(braid_add_transport target)
  add_library(${target} OBJECT ${ARGN})
  target_include_directories(${target} PRIVATE
    ${PROJECT_SOURCE_DIR}/include ${PROJECT_BINARY_DIR}/include ${PROJECT_SOURCE_DIR}/src
    ${PROJECT_SOURCE_DIR})
  set_property(GLOBAL APPEND PROPERTY BRAID_TRANSPORT_OBJECTS ${target})
endfunction()
