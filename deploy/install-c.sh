#!/usr/bin/env bash
# Installs liboncilla's C ABI after `cargo build --release`: the header,
# the shared and static libraries (as liboncilla.so / liboncilla.a) and a
# pkg-config file, so that
#   cc app.c $(pkg-config --cflags --libs oncilla)
# works. Usage: deploy/install-c.sh [PREFIX]   (default /usr/local)
# For a PREFIX pkg-config does not search, also export
#   PKG_CONFIG_PATH=PREFIX/lib/pkgconfig  and  LD_LIBRARY_PATH=PREFIX/lib
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=${1:-/usr/local}
rel=$root/target/release
for f in libliboncilla.so libliboncilla.a; do
  [ -f "$rel/$f" ] || { echo "$rel/$f missing: run cargo build --release -p liboncilla first" >&2; exit 1; }
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
install -d "$prefix/include" "$prefix/lib/pkgconfig"
install -m 644 "$root/liboncilla/include/oncilla.h" "$prefix/include/oncilla.h"
install -m 755 "$rel/libliboncilla.so" "$prefix/lib/liboncilla.so"
install -m 644 "$rel/libliboncilla.a" "$prefix/lib/liboncilla.a"
cat >"$prefix/lib/pkgconfig/oncilla.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: oncilla
Description: Oncilla managed global address space: allocate cluster memory and copy to and from it
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -loncilla
Libs.private: -lpthread -ldl -lm
PC
echo "installed oncilla.h, liboncilla.so, liboncilla.a and oncilla.pc under $prefix"
