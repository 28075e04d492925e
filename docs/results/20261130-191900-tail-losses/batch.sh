#!/bin/bash
# batch.sh SEED N LABEL SHIM OUT: N captured transfers (vdiag.py), emulator seeds SEED + 1000 i,
# the code picked by PYTHONPATH=SHIM (a folder of symlinks into a worktree); one line each in
# OUT/batch.log: label seed RESULT fraction frames seconds | counters | gapstat.py's idle radio
here=$(cd "$(dirname "$0")" && pwd)
py=${PY:-python}
for i in $(seq 0 $(( $2 - 1 ))); do
  s=$(( $1 + 1000 * i ))
  d=$5/$3_$s
  mkdir -p "$d"
  PYTHONPATH=$4 timeout 300 $py "$here/vdiag.py" $s "$d" > "$d.out" 2>&1
  g=$($py "$here/../20261130-163900-probes-and-room/gapstat.py" "$d/r2-r3.pcapng" 2>/dev/null)
  echo "$3 $s $(grep RESULT "$d.out") | $(grep -o '"\(fast_retransmits\|tail_probes\|tail_copies\|duplicates\)": [0-9]*' "$d.out" | tr '\n' ' ') | $g" >> "$5/batch.log"
done
