#!/usr/bin/env bash
# Makes a release of this checkout, in dist/:
#
#   oncilla-VERSION-linux-ARCH.tar.gz (and its .sha256), which holds
#     bin/oncillad, bin/ocmctl             stripped; they need only glibc
#     lib/liboncilla.so.VERSION, .a        the C library, with its SONAME link
#     lib/liboncillamem.so.VERSION         the original runtime's API
#     lib/pkgconfig/oncilla.pc, oncillamem.pc  relocatable (${pcfiledir})
#     include/oncilla.h, oncillamem.h
#     python/oncilla_gas-VERSION-cp39-abi3-manylinux_2_34_ARCH.whl
#     LICENSE, README.md, SHA256SUMS       (of every file above)
#
# and then checks what it made from a copy unpacked elsewhere: both
# programs answer --version, a C program compiles with the tarball's
# pkg-config file and runs against its library, and the wheel installs and
# imports. deploy/kubernetes/Dockerfile builds the image from the tarball.
#
# Usage: deploy/release.sh        (from anywhere in the repository)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
name=oncilla-$version-linux-$(uname -m)
out=$root/dist/$name
say() { [ -t 1 ] && echo "== $*" || true; }

say "build (release)"
cargo build --release --locked -p oncillad -p ocmctl -p oncilla-capi -p oncillamem
rm -rf "$out" "$out.tar.gz" "$out.tar.gz.sha256"
mkdir -p "$out/bin" "$out/python"
install -m 755 target/release/oncillad target/release/ocmctl "$out/bin/"
strip "$out/bin/"*
deploy/install-c.sh "$out" target/release >/dev/null
# Relocatable: the prefix is where the .pc file lies, two levels up.
sed -i 's|^prefix=.*|prefix=${pcfiledir}/../..|' "$out"/lib/pkgconfig/*.pc

say "wheel (release, manylinux_2_34, abi3)"
maturin build --quiet --release --strip --compatibility manylinux_2_34 -m python/Cargo.toml -o "$out/python"

cp LICENSE README.md "$out/"
(cd "$out" && find . -type f ! -name SHA256SUMS | sort | xargs sha256sum > SHA256SUMS)
tar -C "$root/dist" -czf "$out.tar.gz" "$name"
(cd "$root/dist" && sha256sum "$name.tar.gz" > "$name.tar.gz.sha256")

say "check the tarball"
check=$(mktemp -d)
trap 'rm -rf "$check"' EXIT
(cd "$root/dist" && sha256sum --quiet -c "$name.tar.gz.sha256")
tar -C "$check" -xzf "$out.tar.gz"
u=$check/$name
(cd "$u" && sha256sum --quiet -c SHA256SUMS)
for p in oncillad ocmctl; do
  "$u/bin/$p" --version | grep -q "$version" || { echo "$p --version does not say $version" >&2; exit 1; }
done
cat > "$check/v.c" <<'C'
#include <oncilla.h>
#include <stdio.h>
#include <string.h>
int main(void) {
  ocm_params_t p = ocm_params_default(4096, OCM_REMOTE_HOST);
  if (p.struct_size != sizeof p) return 2;
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", OCM_VERSION_MAJOR, OCM_VERSION_MINOR, OCM_VERSION_PATCH);
  printf("%s\n", ocm_version());
  return strcmp(ocm_version(), want) != 0;
}
C
# shellcheck disable=SC2046
cc -std=c11 -o "$check/v" "$check/v.c" \
  $(PKG_CONFIG_PATH="$u/lib/pkgconfig" pkg-config --cflags --libs oncilla) -Wl,-rpath,"$u/lib"
[ "$("$check/v")" = "$version" ] || { echo "the C library says $("$check/v"), not $version" >&2; exit 1; }
python3 -m pip install --quiet --root-user-action=ignore --no-deps --target "$check/site" "$u"/python/*.whl
PYTHONPATH=$check/site python3 -c "import oncilla, sys; sys.exit(oncilla.__version__ != '$version')"
echo "dist/$name.tar.gz ($(du -h "$out.tar.gz" | cut -f1)): programs, C library and wheel checked"
