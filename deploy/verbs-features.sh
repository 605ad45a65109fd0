# Sourced, not run: the cargo features that build the workspace with the
# RDMA verbs fabric. One list for every verbs build (deploy/check.sh's
# tests and clippy, the Soft-RoCE guest's binaries), so that they are one
# build; oncilla-python/verbs lets clippy check the Python module's verbs
# build too. ocmctl/verbs brings oncillad's, liboncilla's and the
# benchmarks'; each crate's switch ends in oncilla-rdma's (the one place
# the feature changes code: rdma/src/lib.rs).
# shellcheck disable=SC2034
VERBS_FEATURES=oncilla-rdma/verbs,oncillad/verbs,liboncilla/verbs,ocmctl/verbs,oncilla-tests/verbs,oncilla-python/verbs
