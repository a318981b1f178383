# orch default Slurm setup: shell lines run by the sbatch script before `srun` starts the ranks.
# Copy this file, edit it for your cluster and pass it as `orch launch --setup FILE`.
# Placeholders {{workdir}}, {{job_name}}, {{partition}}, {{nodes}}, {{tasks_per_node}} are replaced
# by shell-quoted values; any other {{...}} is an error. Typical additions:
#   module load cuda/12.4 nccl
#   source /path/to/venv/bin/activate        (orch submits with the Python that ran `orch launch`)
#   export NCCL_IB_HCA=mlx5 NCCL_SOCKET_IFNAME=ib0
#   export ORCH_CONTAINER_FLAGS="--container-image=..."
export OMP_NUM_THREADS=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export NCCL_DEBUG=WARN
mkdir -p {{workdir}}
