#!/usr/bin/env bash
# libnccl.so.2 has SONAME libnccl.so.2 and exports every function of NCCL
# 2.28's nccl.h (ncclResetDebugInit included) under its nccl and pnccl
# names, 2.29's ncclCommGetUniqueId, ncclCommGrow and ncclWinGetUserPtr,
# 2.30's parameter API and 2.32's per-collective config calls.
#   check_symbols.sh LIBRARY
set -euo pipefail
lib=$1
soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = libnccl.so.2 ] || { echo "SONAME is '$soname', not libnccl.so.2" >&2; exit 1; }
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TW]$/ {print $3}')
missing=0
for f in GetVersion GetUniqueId CommInitRank CommInitRankConfig CommInitAll CommInitRankScalable \
  CommSplit CommShrink CommGetUniqueId CommGrow CommFinalize CommDestroy CommAbort CommRevoke CommGetAsyncError CommCount \
  CommCuDevice CommUserRank GetErrorString GetLastError AllReduce Broadcast Bcast Reduce AllGather \
  ReduceScatter AlltoAll Gather Scatter Send Recv GroupStart GroupEnd GroupSimulateEnd \
  RedOpCreatePreMulSum RedOpDestroy MemAlloc MemFree CommRegister CommDeregister \
  CommWindowRegister CommWindowDeregister ResetDebugInit WinGetUserPtr ParamBind ParamGetI8 \
  ParamGetI16 ParamGetI32 ParamGetI64 ParamGetU8 ParamGetU16 ParamGetU32 ParamGetU64 ParamGetStr \
  ParamGet ParamGetParameter ParamGetAllParameterKeys ParamDumpAll AllReduceConfig \
  BroadcastConfig ReduceConfig AllGatherConfig ReduceScatterConfig AlltoAllConfig GatherConfig \
  ScatterConfig; do
  for name in "nccl$f" "pnccl$f"; do
    grep -qx "$name" <<<"$exported" || { echo "not exported: $name" >&2; missing=1; }
  done
done
others=$(grep -v '^p\?nccl' <<<"$exported" || true)
[ -z "$others" ] || { echo "exported besides the API: $others" >&2; missing=1; }
[ $missing = 0 ] && echo "symbols: all $(wc -l <<<"$exported") exported names present, nothing else"
exit $missing
