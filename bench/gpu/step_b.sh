# Device call B (carry .gpu/b, on the machine call A left warm): rejoin the GGUF, convert it as
# batchspec.models does, and run the held-out calibration bench on CUDA, one or two keys a run
# (WORKLOADS; a 4-key run takes 4-6 minutes there). T8, T1, T4: each run's limit in seconds.
set -x
S=/root/stash
test -f $S/smol.part_a || { echo "NO STASH: the machine of call A is gone"; exit 3; }
cat $S/smol.part_a .gpu/b/smol.part_b > $S/smol.gguf
echo "$(python3 -c 'from batchspec.models import REGISTRY; print(REGISTRY["smollm2-135m"].sha256)')  $S/smol.gguf" | sha256sum -c || exit 4
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $S/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
timeout 120 python3 bench/gpu/convert.py $S/smol.gguf /root/smol 2>&1 | tail -3
run() { b=$1; r=$2; t=$3; timeout $t python3 bench/calibrate.py --model /root/smol --input $S/held7.parquet --rows $r --max-tokens 24 \
  --batch-size $b --dtype float32 --in-flight --later-shard --device cuda --workloads ${WORKLOADS:-extract,continue} \
  --out $OUT/b${b}x$r > /tmp/b${b}x$r.log 2>&1; e=$?; cat /tmp/b${b}x$r.log >> $OUT/bench.log; echo "b${b}x$r exit $e at $SECONDS s"; tail -25 /tmp/b${b}x$r.log; }
run 8 64 ${T8:-150}
run 1 32 ${T1:-150}
run 4 64 ${T4:-120}
