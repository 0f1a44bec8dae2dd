# What `cmake --install` puts under the prefix, in the layout of a Debian system (GNUInstallDirs),
# and the .deb that CPack makes of it (`make package`, or `cpack -G DEB` in the build folder):
#   bin/chNN_*                      the chapter executables (chapters/CMakeLists.txt)
#   share/inferlab/data/models      the bundled models, each with its tokenizer and card
#   share/inferlab/data/corpus      the validation text, the probes and the calibration sample
#   share/doc/inferlab/             the READMEs and docs/ pages; html/ when `make docs` has run
# An installed executable finds its data from its own folder (../share/inferlab/data) or through
# INFERLAB_DATA (common/cli.h, data_dir()). The goldens and the tests stay in the source tree:
# no executable reads them.

# --- the data the executables read by default ---------------------------------------------------
install(DIRECTORY "${INFERLAB_DATA_DIR}/models" "${INFERLAB_DATA_DIR}/corpus"
        DESTINATION "${INFERLAB_INSTALL_DATADIR}" COMPONENT data)

# --- the documentation, with the source tree's layout so that the READMEs' links still resolve --
install(FILES "${PROJECT_SOURCE_DIR}/README.md" DESTINATION "${CMAKE_INSTALL_DOCDIR}" COMPONENT doc)
file(GLOB chapter_readmes RELATIVE "${PROJECT_SOURCE_DIR}" CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/chapters/*/README.md")
foreach(readme IN LISTS chapter_readmes)
  get_filename_component(dir "${readme}" DIRECTORY)
  install(FILES "${readme}" DESTINATION "${CMAKE_INSTALL_DOCDIR}/${dir}" COMPONENT doc)
endforeach()
install(DIRECTORY "${PROJECT_SOURCE_DIR}/docs/" DESTINATION "${CMAKE_INSTALL_DOCDIR}/docs" COMPONENT doc
        FILES_MATCHING PATTERN "*.md" PATTERN "*.svg")

# --- the Debian package --------------------------------------------------------------------------
set(INFERLAB_PACKAGE_MAINTAINER "InferLab maintainers <inferlab@example.org>" CACHE STRING
    "The .deb's Maintainer field: whoever builds and distributes the package")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME inferlab)
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "LLM inference, step by step, in C++ and CUDA")
set(CPACK_PACKAGE_DESCRIPTION
    "InferLab implements the techniques of LLM inference one chapter at a time: the workload and
its roofline, naive decoding, the KV cache, GQA, MLA, cross-layer attention, sliding windows,
Mamba, masked diffusion, quantisation, speculative sampling, continuous batching and paged
attention. Each chapter is a command (ch00_workload ... ch12_paged_attention) that runs on the
bundled tiny models and prints its headline result; the package holds the commands, the models
and corpus they read, and the chapters' documentation.")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${INFERLAB_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # inferlab_<version>_<arch>.deb
set(CPACK_STRIP_FILES ON)
# The dependencies on the runtime libraries the executables link (libgomp1, libpcre2-8-0,
# libutf8proc2, libstdc++6, ...): computed by dpkg-shlibdeps where it is installed (dpkg-dev),
# else the list of a Debian 12 build. The CUDA runtime and cuBLAS of a CUDA build come from
# NVIDIA's packages, which dpkg-shlibdeps does not know: the target machine needs them installed.
find_program(INFERLAB_DPKG_SHLIBDEPS dpkg-shlibdeps)
mark_as_advanced(INFERLAB_DPKG_SHLIBDEPS)
if(INFERLAB_DPKG_SHLIBDEPS)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
else()
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6, libgcc-s1, libgomp1, libpcre2-8-0, libstdc++6, libutf8proc2, libcpp-httplib0.11")
endif()
include(CPack)
