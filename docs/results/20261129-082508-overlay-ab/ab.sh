#!/bin/bash
# interleaved A/B on the testbed: old (c0437e2 via shim) and new (HEAD) on the same loss patterns
cd /work/main
for s in "$@"; do
  for v in new old; do
    if [ $v = old ]; then pp=/tmp/c2shim; else pp=; fi
    out=$(cd /tmp && PYTHONPATH=$pp timeout 600 /work/main/.venv/bin/python /tmp/c2stall/ab1.py $s 2>/dev/null | tail -1)
    echo "$v $out"
  done
done
