#!/usr/bin/env bash
# Installs Oncilla's two C libraries after `cargo build --release`:
#   liboncilla (oncilla.h; liboncilla.so and liboncilla.a; oncilla.pc)
#   liboncillamem, the original runtime's API (oncillamem.h;
#     liboncillamem.so; oncillamem.pc)
# Each shared library is installed as lib*.so.VERSION, with its SONAME
# (lib*.so.ABI: the major version, or 0.MINOR before 1.0; see capi/build.rs)
# and lib*.so linking to it, as distributions lay libraries out: programs
# record the ABI they were linked against and run only with that one.
# so that
#   cc app.c $(pkg-config --cflags --libs oncilla)
#   cc old_app.c $(pkg-config --cflags --libs oncillamem)
# work. A program links one of the two: their functions share names.
#
# Usage: deploy/install-c.sh [PREFIX [LIBDIR]]
#   PREFIX  where to install (default /usr/local)
#   LIBDIR  where cargo left the libraries (default $CARGO_TARGET_DIR/release
#           or target/release; the tests install a debug build from
#           target/debug/deps)
# For a PREFIX pkg-config does not search, also export
#   PKG_CONFIG_PATH=PREFIX/lib/pkgconfig  and  LD_LIBRARY_PATH=PREFIX/lib
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=${1:-/usr/local}
from=${2:-${CARGO_TARGET_DIR:-$root/target}/release}
for f in liboncilla.so liboncilla.a liboncillamem.so; do
  [ -f "$from/$f" ] || {
    echo "$from/$f missing: run cargo build --release -p oncilla-capi -p oncillamem first" >&2
    exit 1
  }
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
major=${version%%.*}
abi=$major
[ "$major" = 0 ] && abi=0.$(echo "$version" | cut -d. -f2)
install -d "$prefix/include" "$prefix/lib/pkgconfig"
install -m 644 "$root/capi/include/oncilla.h" "$root/oncillamem/include/oncillamem.h" "$prefix/include/"
for lib in liboncilla liboncillamem; do
  install -m 755 "$from/$lib.so" "$prefix/lib/$lib.so.$version"
  ln -sfn "$lib.so.$version" "$prefix/lib/$lib.so.$abi"
  ln -sfn "$lib.so.$abi" "$prefix/lib/$lib.so"
done
install -m 644 "$from/liboncilla.a" "$prefix/lib/"
# The installed copies without debug information (the build keeps line
# tables for profiling): a 39 MB shared library is 5 MB stripped.
if command -v strip >/dev/null; then
  strip --strip-unneeded "$prefix"/lib/liboncilla.so."$version" "$prefix"/lib/liboncillamem.so."$version"
  strip --strip-debug "$prefix/lib/liboncilla.a"
fi
# pc NAME LIB DESCRIPTION: the pkg-config file of one library.
pc() {
  cat >"$prefix/lib/pkgconfig/$1.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: $1
Description: $3
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -l$2
Libs.private: -lpthread -ldl -lm
PC
}
pc oncilla oncilla "Oncilla managed global address space: allocate cluster memory and copy to and from it"
pc oncillamem oncillamem "The original Oncilla runtime's API (oncillamem.h) over an Oncilla cluster"
echo "installed oncilla.h, oncillamem.h, liboncilla.so.$version (.so.$abi, .so) and .a, liboncillamem.so.$version (.so.$abi, .so), oncilla.pc and oncillamem.pc under $prefix"
# The dynamic linker finds a new library in a directory it searches only
# once its cache knows it: refreshed here where that is the case (as
# root), else said.
if [ "$prefix" = /usr ] || grep -rqsxF "$prefix/lib" /etc/ld.so.conf /etc/ld.so.conf.d/; then
  if [ "$(id -u)" = 0 ]; then
    ldconfig
  else
    echo "run ldconfig as root, so programs find liboncilla.so.$abi in $prefix/lib"
  fi
else
  echo "programs find the libraries with LD_LIBRARY_PATH=$prefix/lib (pkg-config with PKG_CONFIG_PATH=$prefix/lib/pkgconfig)"
fi
