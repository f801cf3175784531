#!/usr/bin/env bash
# Prints the Debian packages that provide the shared libraries the given binaries load, one per
# line, so that a runtime image installs exactly those (docker/Dockerfile.cpu, Dockerfile.gpu).
#   docker/runtime-deps.sh build/bin/attnserve build/bin/attnctl > runtime-packages.txt
# Libraries under /usr/local/cuda (the CUDA runtime, NCCL, cuBLAS...) are not Debian packages: they
# are listed on stderr and must come with the base image (attnserve/cuda-runtime, see
# docker/README.md). The NVIDIA driver's own libraries (libcuda, libnvidia-ml) are mounted into the
# container at run time by the NVIDIA Container Toolkit and are skipped.
# Exits 1 if a library is missing or belongs to no package.
set -euo pipefail
status=0
declare -A pkgs=()
while read -r name path; do
  case "$name" in
    libcuda.so.*|libnvidia-ml.so.*|libnvidia-*.so.*) continue ;;
  esac
  if [ "$path" = "not-found" ]; then
    echo "runtime-deps: $name: not found" >&2; status=1; continue
  fi
  real=$(realpath "$path")
  case "$real" in
    /usr/local/cuda*|/opt/*) echo "runtime-deps: $name: $real (from the base image, not a package)" >&2; continue ;;
  esac
  pkg=""
  # merged /usr: dpkg may know the file as /lib/... or /usr/lib/...
  for cand in "$path" "$real" "${real#/usr}" "/usr${path}"; do
    if owner=$(dpkg-query -S "$cand" 2>/dev/null); then pkg=${owner%%:*}; break; fi
  done
  if [ -z "$pkg" ]; then
    echo "runtime-deps: $name: $real belongs to no Debian package" >&2; status=1; continue
  fi
  pkgs[$pkg]=1
done < <(ldd "$@" | awk '
  /=> not found/ { print $1, "not-found"; next }
  /=> \// { print $1, $3 }' | sort -u)
printf '%s\n' "${!pkgs[@]}" | sort
exit $status
