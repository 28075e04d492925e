import json, sys
from c2dtn.perf import overlay_bench as ob
r = ob.tactical(seed=int(sys.argv[1]))
print(json.dumps({"seed": r["seed"], "fraction": r["fraction"], "seconds": r["seconds"], "frames": r["link_frames_ab"]}))
