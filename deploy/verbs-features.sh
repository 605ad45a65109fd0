# Sourced, not run: the cargo features that build the workspace with the
# RDMA verbs fabric. One list for every verbs build (deploy/check.sh's
# tests, the Soft-RoCE guest's binaries, the Python wheel), so that they
# are one build. ocmctl/verbs brings oncillad's, liboncilla's and the
# benchmarks'; each crate's switch ends in oncilla-rdma's (the one place
# the feature changes code: rdma/src/lib.rs).
# shellcheck disable=SC2034
VERBS_FEATURES=oncilla-rdma/verbs,oncillad/verbs,liboncilla/verbs,ocmctl/verbs,oncilla-tests/verbs,oncilla-python/verbs
