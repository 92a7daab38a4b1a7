#!/usr/bin/env bash
# A GPU session's work as one detached job, so that it runs on between the device tool's calls (each at most
# 10 minutes; the machine stays warm for 30 s after each). Run from the repository root on the GPU machine:
#
#   tools/gpu/background.sh start 540 suite masks-record    # install .whl, start the steps in order, wait 540 s
#   tools/gpu/background.sh wait 560                         # the next call, at once: wait for the job again
#
# Each call ends by packing the job's folder (logs, each step's rc and seconds, the recorded JSON, probe output)
# into $OUT/res.tgz and printing the steps and the end of each log. The steps (names below) run one after the other:
# timings never share the GPU with the test suite. `start` needs the Jupyter wheels in .whl
# (../shared/tools/gpu-notebook-wheels.sh; carry .whl with the call).
set -u
R=/tmp/gpurun
cd "$(dirname "$0")/../.."

job() {
    export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 FLASHATTN_NOTEBOOK_WORKERS=8
    python3 -m ipykernel install --user --name python3 >/dev/null 2>&1
    { nvidia-smi; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
      nproc; git rev-parse HEAD 2>/dev/null; } > $R/versions.txt 2>&1
    for name in "$@"; do
        echo "$(date +%T) start $name" >> $R/steps.txt
        t0=$(date +%s)
        case $name in
            suite) python3 -m pytest tests -q -p no:cacheprovider --durations=40 -n 12 -rfE --timeout 1500 \
                       --record-durations $R/gpu_durations.json --junitxml=$R/suite.xml ;;
            *-record) python3 -m flashattn.record --only "${name%-record}" ;;
            *-probe) OUT=$R python3 "tools/gpu/${name%-probe}/probe.py" ;;
            *) echo "unknown step $name (suite, NAME-record, DIR-probe)"; false ;;
        esac > $R/$name.log 2>&1
        rc=$?
        echo "$(date +%T) end $name rc=$rc $(( $(date +%s) - t0 ))s" >> $R/steps.txt
        cp figures/data/*.json $R/ 2>/dev/null
    done
    touch $R/done
}

case ${1:-} in
    start)
        wait_s=$2; shift 2
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl 2>&1 | tail -2
        rm -rf $R && mkdir -p $R
        export -f job; export R
        setsid nohup bash -c 'job "$@"' job "$@" > $R/job.out 2>&1 < /dev/null & ;;
    wait) wait_s=$2 ;;
    *) echo "usage: $0 start SECONDS STEP... | wait SECONDS"; exit 2 ;;
esac
end=$(( $(date +%s) + wait_s ))
while [ ! -e $R/done ] && [ "$(date +%s)" -lt $end ]; do sleep 5; done
tar czf "${OUT:-.}/res.tgz" -C /tmp gpurun
cat $R/steps.txt
for f in $R/*.log; do echo "== $f"; tail -c 1500 "$f"; done
