#!/usr/bin/env bash
# Nsight Systems for a GPU machine that has none (the lent runner's image has no nsys, PyPI has no wheel of it,
# and the runner has no network): build, on a Debian 12 machine with network, one archive of the command-line
# collector and what turns its raw capture into a report, small enough to travel with the repository.
#
#   bash scripts/nsys_bundle.sh OUT.tar.xz        (about 30 MB; keep it in an ignored folder, e.g. build/)
#   KM_NSYS_SUITE=trixie bash scripts/nsys_bundle.sh OUT.tar.xz     (Debian 13's 2023.4, CUPTI 12.4; larger)
#
# On the GPU machine:
#   mkdir -p /tmp/nsys && tar xJf OUT.tar.xz -C /tmp/nsys
#   export PATH=/tmp/nsys/target-linux-x64:$PATH
#   ldd /tmp/nsys/target-linux-x64/nsys /tmp/nsys/host-linux-x64/QdstrmImporter | grep -q "not found" \
#     && export LD_LIBRARY_PATH=/tmp/nsys/lib     (the runner's Ubuntu 24.04 image lacks libpfm.so.4, which
#                                                   the importer links: without it nsys stops at .qdstrm)
#   bash scripts/capture_nsys.sh OUTDIR
#
# From Debian's non-free section (the nsight-systems packages of Debian 12, version 2022.4, CUPTI up to 11.8; or of
# Debian 13, version 2023.4, CUPTI 12.4, about 40 MB packed):
# - nsight-systems-target: `nsys` itself, the CUDA injection libraries and the `nsys stats` reports. Dropped: every
#   CUPTI library but the newest and the MPI, SHMEM, UCX, cuDNN and Vulkan layers (the captures trace CUDA only);
# - nsight-systems (the GUI's package, 130 MB): only QdstrmImporter and the libraries it links, which turn the
#   collector's .qdstrm into the .nsys-rep that `nsys stats` reads (without it `nsys profile` stops at .qdstrm);
# - libssh-4, which the importer links as libssh.so, and the few system libraries nsys links that a minimal image
#   may lack (lib/, for LD_LIBRARY_PATH only where the image has no copy of its own).
set -euo pipefail
OUT=$(realpath -m "${1:?usage: nsys_bundle.sh OUT.tar.xz}")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
mkdir -p lists/partial
# 2022.4 (bookworm) records a CUDA 13 driver's calls but cannot analyse a trace that holds a driver function newer
# than it knows (the capstone's eager step); trixie's 2023.4 knows CUDA 12.4's
SUITE=${KM_NSYS_SUITE:-bookworm}
echo "deb http://deb.debian.org/debian $SUITE main non-free" > sources.list
APT=(-o Dir::Etc::SourceList="$WORK/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o Dir::State::Lists="$WORK/lists" -o Debug::NoLocking=1)
apt-get "${APT[@]}" update > /dev/null
apt-get "${APT[@]}" download nsight-systems-target nsight-systems libssh-4 2> /dev/null
for d in *.deb; do dpkg -x "$d" x; done
T=x/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64
H=x/usr/lib/nsight-systems/host-linux-x64
mkdir -p b/host-linux-x64 b/lib
cp -a "$T" b/
# only the newest CUPTI (the one that matches the newest drivers) and no MPI, SHMEM, UCX, cuDNN or Vulkan layer
(cd b/target-linux-x64 && NEWEST=$(ls libcupti.so.* | sort -V | tail -n 1) \
  && for c in libcupti.so.*; do [ "$c" = "$NEWEST" ] || rm -f "$c"; done \
  && rm -rf CollectX vulkan-layers nvtx libToolsInjectionMPICH64.so libToolsInjectionOpenMPI64.so \
    libToolsInjectionOpenSHMEM64.so libToolsInjectionUCP64.so libToolsInjectionCuDNN64_*.so \
    libToolsInjectionCuBLAS64_10.so)
cp "$H/QdstrmImporter" b/host-linux-x64/
cp -L x/usr/lib/x86_64-linux-gnu/libssh.so.4 b/host-linux-x64/libssh.so
LD_LIBRARY_PATH=$H ldd "$H/QdstrmImporter" | awk '$3 ~ /host-linux-x64/ {print $3}' \
  | while read -r lib; do cp -L "$lib" b/host-linux-x64/; done
for lib in libpfm.so.4 libgssapi_krb5.so.2 libkrb5.so.3 libk5crypto.so.3 libkrb5support.so.0 libcom_err.so.2 \
           libkeyutils.so.1; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')" b/lib/
done
b/target-linux-x64/nsys --version
tar cJf "$OUT" -C b .
ls -la "$OUT"
