# Device call A (carry .gpu/a): stash part a of the GGUF, the wheel and the prompts on the device for
# call B, and run the prepared torch GPU check. About 2 minutes once the machine is up.
set -x
mkdir -p /root/stash && cp .gpu/a/smol.part_a .gpu/a/held7.parquet .gpu/a/*.whl /root/stash/
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv
nproc; python3 -c "import torch, transformers, pyarrow; print(torch.__version__, transformers.__version__, pyarrow.__version__, torch.cuda.get_device_name())"
export PYTHONUNBUFFERED=1
timeout 300 python3 jobs/gpu_check.py --engine torch --out $OUT/gpu_torch_profile.json 2>&1 | tee $OUT/torch_check.log
echo "torch check exit ${PIPESTATUS[0]}"
timeout 30 python3 jobs/gpu_check.py 2>&1 | tail -3
echo "trtllm check exit ${PIPESTATUS[0]}"
ls -la /root/stash
