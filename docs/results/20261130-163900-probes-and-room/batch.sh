#!/bin/bash
# N transfers on emulator seeds S + 1000 i, each captured, with the code a PYTHONPATH shim
# (a folder of symlinks into a worktree) points at: batch.sh S N LABEL SHIM
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-$HERE/../../../.venv/bin/python}
cd /tmp
S=${1:-1600000000}; N=${2:-8}; V=${3:-run}; SHIM=${4:?a PYTHONPATH shim}
for i in $(seq 0 $((N-1))); do
  seed=$((S + i*1000))
  d=/tmp/c2-batch/${V}_$seed; mkdir -p /tmp/c2-batch; rm -rf $d
  PYTHONPATH=$SHIM $PY $HERE/tbdiag.py $seed $d > $d.log 2>&1
  res=$(grep RESULT $d.log)
  cnt=$(grep -o '"fast_retransmits": [0-9]*\|"tail_probes": [0-9]*' $d.log | tr '\n' ' ')
  dup=$(grep -o '"duplicates": [0-9]*' $d.log)
  gs=$($PY $HERE/gapstat.py $d/r2-r3.pcapng 2>&1 | tail -1)
  echo "$V $seed $res | $cnt $dup | $gs"
done
echo DONE
