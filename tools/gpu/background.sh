#!/usr/bin/env bash
# A GPU session's work as one detached job, so that it runs on between the device tool's calls (each at most
# 10 minutes; the machine stays warm for 30 s after each). Run from the repository root on the GPU machine:
#
#   tools/gpu/background.sh start 540 suite masks-record    # install .whl, start the steps in order, wait 540 s
#   tools/gpu/background.sh wait 560                         # the next call, at once: wait for the job again
#                                                            # (a machine can be handed back between two calls even
#                                                            # so; `wait` then says the job is lost, at once: keep a
#                                                            # step that matters, the suite, within one call)
#   tools/gpu/background.sh part .tri39/part_aa              # another Triton's wheel, one part per call (carry it),
#   tools/gpu/background.sh join triton-3.9.0-....whl         # then joined and installed into /tmp/tri39; a step
#                                                            # named tri39:STEP runs STEP under it (it waits for it)
#
# Each call ends by packing the job's folder (logs, each step's rc and seconds, the recorded JSON, probe output)
# into $OUT/res.tgz and printing the steps and the end of each log; what record steps wrote is in gpurun/data. The steps (names below) run one after the other:
# timings never share the GPU with the test suite. `start` needs the Jupyter wheels in .whl
# (../shared/tools/gpu-notebook-wheels.sh; carry .whl with the call).
set -u
R=/tmp/gpurun
cd "$(dirname "$0")/../.."

job() {
    export PYTHONPATH=/tmp/site:$PWD TRI PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 FLASHATTN_NOTEBOOK_WORKERS=8
    python3 -m ipykernel install --user --name python3 >/dev/null 2>&1
    { nvidia-smi; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
      nproc; git rev-parse HEAD 2>/dev/null; } > $R/versions.txt 2>&1
    # Recordings go to $R/data, not figures/data: each device call copies the working tree over again, and would put
    # the tree's own figures/data back over what a record step wrote (it did so in stop 37).
    mkdir -p $R/data && cp figures/data/*.json $R/data/
    for name in "$@"; do
        echo "$(date +%T) start $name" >> $R/steps.txt
        t0=$(date +%s)
        (
            step=$name
            if [[ $step == tri39:* ]]; then  # under the Triton joined by `join` (waits for it)
                step=${step#tri39:}
                for _ in $(seq 120); do [ -e $TRI/triton/__init__.py ] && break; sleep 5; done
                export PYTHONPATH=$TRI:$PYTHONPATH
                python3 -c "import triton; print('triton', triton.__version__, triton.__file__)"
            fi
            case $step in
                suite) python3 -m pytest tests -q -p no:cacheprovider --durations=40 -n 12 -rfE --timeout 1500 \
                           --record-durations $R/gpu_durations.json --junitxml=$R/suite.xml ;;
                tests/*) python3 -m pytest "$step" -q -p no:cacheprovider -rfE ;;
                *-record) FLASHATTN_DATA_DIR=$R/data python3 -m flashattn.record --only "${step%-record}" ;;
                *-probe) OUT=$R python3 "tools/gpu/${step%-probe}/probe.py" ;;
                *.py) OUT=$R python3 "tools/gpu/$step" ;;
                *) echo "unknown step $step (suite, tests/FILE, NAME-record, DIR-probe, DIR/FILE.py; tri39: before any)"
                   false ;;
            esac
        ) > "$R/$(echo "$name" | tr '/:' '__').log" 2>&1
        rc=$?
        echo "$(date +%T) end $name rc=$rc $(( $(date +%s) - t0 ))s" >> $R/steps.txt
    done
    touch $R/done
}

TRI=/tmp/tri39  # another Triton, carried in parts: `part FILE` per call (machine warm), then `join`
case ${1:-} in
    part) mkdir -p /tmp/triparts && cp "$2" /tmp/triparts/ && ls -la /tmp/triparts; exit ;;
    join) cat /tmp/triparts/part_* > /tmp/triparts/"$2" && rm /tmp/triparts/part_* &&
          python3 -m pip install -q --no-index --no-deps --no-compile --target $TRI /tmp/triparts/"$2" 2>&1 | tail -2
          PYTHONPATH=$TRI python3 -c "import triton; print('joined triton', triton.__version__)"; exit ;;
    start)
        wait_s=$2; shift 2
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl 2>&1 | tail -2
        rm -rf $R && mkdir -p $R
        export -f job; export R TRI
        setsid nohup bash -c 'job "$@"' job "$@" > $R/job.out 2>&1 < /dev/null & ;;
    wait) wait_s=$2
          if [ ! -d $R ]; then  # a fresh machine (the last one was handed back between calls): nothing to wait for
              echo "no job on this machine: it is a fresh one, and the job started before is lost; start it again"
              exit 3
          fi ;;
    *) echo "usage: $0 start SECONDS STEP... | wait SECONDS | part FILE | join WHEEL-NAME"; exit 2 ;;
esac
end=$(( $(date +%s) + wait_s ))
while [ ! -e $R/done ] && [ "$(date +%s)" -lt $end ]; do sleep 5; done
tar czf "${OUT:-.}/res.tgz" -C /tmp gpurun
cat $R/steps.txt
for f in $R/*.log; do echo "== $f"; tail -c 1500 "$f"; done
