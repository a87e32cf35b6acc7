# `cmake --install` lays out headers, libbraid, the tools, a CMake package
# (find_package(braid) -> braid::braid) and a pkg-config file (braid.pc).
include(CMakePackageConfigHelpers)

install(TARGETS braid EXPORT braidTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# libnccl.so.2 goes in a folder of its own, so that it replaces NCCL only for
# programs run with that folder on their library path.
install(TARGETS braid_nccl
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/braid-nccl)
install(DIRECTORY include/braid DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/include/braid/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/braid)
install(EXPORT braidTargets NAMESPACE braid:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/braid)

configure_package_config_file(cmake/braidConfig.cmake.in
  ${PROJECT_BINARY_DIR}/braidConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/braid)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/braidConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/braidConfig.cmake ${PROJECT_BINARY_DIR}/braidConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/braid)

file(RELATIVE_PATH BRAID_PC_UP "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
configure_file(cmake/braid.pc.in ${PROJECT_BINARY_DIR}/braid.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/braid.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
