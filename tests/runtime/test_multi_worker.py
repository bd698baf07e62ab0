"""Workers of a MultiWorkerMirroredStrategy job run one precision decision, or all stop with one line.

The rule and the exchange are checked in-process against a store that
behaves as the coordination service's (inserts never overwrite, reads wait);
two worker processes on loopback check the whole path.
"""

import json
import logging
import threading
from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf
from fixtures.harness import Script, free_ports, run_scripts
from helpers import KeyValueStore as Store

from amp_rewrite import runtime
from amp_rewrite.errors import RuntimeRewriteError
from amp_rewrite.runtime import multi_worker
from amp_rewrite.runtime.multi_worker import (
    FLOAT32,
    VERDICT_KEY,
    Agreement,
    Cluster,
    Decision,
    Setting,
    decide,
    exchange,
    setting_key,
)
from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings
from amp_rewrite.runtime.target import TargetChoice

CHIEF, WORKER1, WORKER2 = ("worker", 0), ("worker", 1), ("worker", 2)
TWO = (CHIEF, WORKER1)
DYNAMIC = LossScaleSettings()
F16 = Setting(Decision("float16", DYNAMIC))
BF16 = Setting(Decision("bfloat16"))


def run_workers(settings, *, store=None, wait=0.3):
    """Runs the exchange for each task with a setting (None: a worker without the runtime), in threads."""
    store = store or Store()
    tasks = tuple(settings)
    verdicts = {}

    def worker(task):
        verdicts[task] = exchange(Cluster(tasks, task), settings[task], store, wait=wait)

    threads = [threading.Thread(target=worker, args=(task,)) for task, own in settings.items() if own is not None]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10 * wait + 5)
    return verdicts, store


# --- the rule -------------------------------------------------------------------------------


def test_every_worker_published_the_chiefs_decision_is_the_jobs():
    verdict = decide(Cluster(TWO, WORKER1), {CHIEF: F16, WORKER1: BF16}, wait=10)
    assert verdict.decision == F16.decision
    assert verdict.reason == "the chief (worker 0) chose it"
    assert verdict.failure is None


def test_a_silent_worker_makes_the_job_float32_and_is_named():
    verdict = decide(Cluster((CHIEF, WORKER1, WORKER2), CHIEF), {CHIEF: F16, WORKER1: F16, WORKER2: None}, wait=10)
    assert verdict.decision == FLOAT32
    assert verdict.reason.startswith("worker 2 published no amp-rewrite setting within 10 s")
    assert verdict.failure is None


def test_a_strict_worker_turns_a_difference_into_one_failure_naming_both_sides():
    strict = Setting(F16.decision, is_strict=True)
    verdict = decide(Cluster(TWO, CHIEF), {CHIEF: strict, WORKER1: BF16}, wait=10)
    assert verdict.failure == (
        "the workers of this multi-worker job differ (worker 0: float16 with dynamic loss scaling (from 32768, "
        "doubling after 2000 finite steps); worker 1: bfloat16 without loss scaling) and AMP_REWRITE_STRICT=1 "
        f"is set on worker 0: {multi_worker.FIX}")
    agreed = decide(Cluster(TWO, CHIEF), {CHIEF: strict, WORKER1: F16}, wait=10)
    assert agreed.failure is None and agreed.decision == F16.decision


def test_decisions_differ_by_target_and_by_loss_scaling_but_not_by_logging(monkeypatch):
    def decision(target, **env):
        monkeypatch.delenv("AMP_LOSS_SCALE", raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        settings = RuntimeSettings.from_env({"AMP_REWRITE_TARGET": target, **env})
        return Decision.of(settings, TargetChoice(target, "asked"))

    assert decision("float16") == decision("float16", AMP_LOSS_SCALE_LOG_STEPS="5")
    assert decision("float16") == decision("float16", AMP_LOSS_SCALE_GROUPED="1")  # a device's way, not a policy
    assert decision("float16") != decision("float16", AMP_LOSS_SCALE="128")
    assert decision("float16") != decision("float16", AMP_LOSS_SCALE_INIT="1024")
    assert decision("float16", AMP_LOSS_SCALE="128") == decision("float16", AMP_LOSS_SCALE="128",
                                                                 AMP_LOSS_SCALE_GROWTH_INTERVAL="10")
    assert decision("bfloat16") == Decision("bfloat16", is_timed=True)  # ENABLE_AUTO_MP times steps
    assert decision("bfloat16", AMP_REWRITE_TUNE="0") == Decision("bfloat16")
    assert decision("bfloat16", AMP_LOSS_SCALE="dynamic") == Decision("bfloat16", DYNAMIC, is_timed=True)
    assert Decision.of(RuntimeSettings(), TargetChoice(None, "no GPU")) == FLOAT32
    assert decision("float16", AMP_LOSS_SCALE="128").describe() == ("float16 with a fixed loss scale of 128 and "
                                                                    "timed steps")
    assert decision("float16", AMP_LOSS_SCALE="128", AMP_REWRITE_TUNE="0").describe() == \
        "float16 with a fixed loss scale of 128"


@pytest.mark.parametrize("job, local_env, scales", [
    (Decision("bfloat16"), {"AMP_LOSS_SCALE": "dynamic"}, False),
    (Decision("bfloat16", DYNAMIC), {}, True),
    (Decision("float16", LossScaleSettings(False, 128.0)), {"AMP_LOSS_SCALE_LOG_STEPS": "7"}, True),
    (Decision("bfloat16", is_timed=True), {"AMP_REWRITE_TUNE": "0"}, False),
])
def test_following_a_decision_gives_the_settings_that_run_it(monkeypatch, job, local_env, scales):
    for name, value in local_env.items():
        monkeypatch.setenv(name, value)
    local = RuntimeSettings.from_env({"AMP_REWRITE_TARGET": "bfloat16", **local_env})
    followed = job.settings_for(local)
    assert followed.target == job.target
    assert runtime.scales_loss(followed) is scales
    assert followed.is_timing_steps is job.is_timed
    # What this worker now runs is the job's decision, and its log cadence stays its own.
    assert Decision.of(followed, TargetChoice(job.target, "job")) == job
    assert followed.loss_scale.log_every == local.loss_scale.log_every


def test_a_worker_joins_its_gradients_as_its_own_device_says_whatever_the_chief_publishes():
    chief = Decision("float16", replace(DYNAMIC, grouped=True))
    published = json.loads(Setting(chief).to_json())["decision"]["loss_scale"]
    assert "grouped" not in published  # a peer of any version reads what it shares
    assert Setting.from_json(Setting(chief).to_json()).decision == chief
    for local in (None, False, True):
        settings = RuntimeSettings(target="float16", loss_scale=LossScaleSettings(grouped=local))
        assert chief.settings_for(settings).loss_scale.grouped is local


# --- the exchange ---------------------------------------------------------------------------


def test_workers_that_differ_all_take_the_chiefs_decision():
    verdicts, store = run_workers({CHIEF: F16, WORKER1: BF16, WORKER2: Setting(FLOAT32)})
    assert {task: v.decision for task, v in verdicts.items()} == dict.fromkeys((CHIEF, WORKER1, WORKER2),
                                                                               F16.decision)
    assert Setting.from_json(store.values[setting_key(WORKER1)]) == BF16


@pytest.mark.parametrize("silent", [CHIEF, WORKER1])
def test_a_worker_without_the_runtime_makes_every_other_run_float32(silent):
    settings = {CHIEF: F16, WORKER1: F16, WORKER2: F16}
    settings[silent] = None
    verdicts, _ = run_workers(settings)
    assert len(verdicts) == 2
    for verdict in verdicts.values():
        assert verdict.decision == FLOAT32
        assert verdict.reason.startswith(f"{multi_worker.name(silent)} published no amp-rewrite setting")


def test_a_worker_later_than_the_wait_reads_the_verdict_written_without_it():
    store = Store()
    early, _ = run_workers({CHIEF: F16, WORKER1: None}, store=store, wait=0.2)
    late = exchange(Cluster(TWO, WORKER1), F16, store, wait=0.2)
    assert early[CHIEF].decision == late.decision == FLOAT32
    assert late.reason.startswith("worker 1 published no amp-rewrite setting within 0.2 s")


def test_the_first_verdict_written_is_every_workers():
    store = Store()
    store.insert(VERDICT_KEY, multi_worker.Verdict(Decision("bfloat16"), "written first").to_json())
    verdicts, _ = run_workers({CHIEF: F16, WORKER1: F16}, store=store)
    assert {v.reason for v in verdicts.values()} == {"written first"}


# --- following the job's decision -----------------------------------------------------------


class FakeResolver:
    def __init__(self, index, workers=2):
        self.task_type, self.task_id = "worker", index
        self.spec = tf.train.ClusterSpec({"worker": [f"localhost:{1000 + i}" for i in range(workers)]})

    def cluster_spec(self):
        return self.spec


class FakeStrategy:
    def __init__(self, index, workers=2):
        self.cluster_resolver = FakeResolver(index, workers)


@pytest.fixture
def coordinated(monkeypatch):
    """The job's store is there, and TensorFlow's internals for it are."""
    monkeypatch.setattr(multi_worker.tf_internals, "has_coordination_service", lambda: True)
    reported = []
    monkeypatch.setattr(multi_worker.tf_internals, "report_error_to_job", reported.append)
    return reported


def agree_in_threads(agreements):
    threads = [threading.Thread(target=a.agree, args=(FakeStrategy(i),)) for i, a in enumerate(agreements)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)


def test_a_differing_worker_says_so_in_one_line_and_follows(coordinated, caplog):
    store, followed = Store(), []
    chief = Agreement(RuntimeSettings(target="float16", peer_wait_seconds=1), TargetChoice("float16", "asked"),
                      lambda *a: followed.append(("chief", a)), store)
    worker = Agreement(RuntimeSettings(target="bfloat16", peer_wait_seconds=1), TargetChoice("bfloat16", "asked"),
                       lambda *a: followed.append(("worker", a)), store)
    with caplog.at_level(logging.INFO, "amp_rewrite"):
        agree_in_threads([chief, worker])
    [(who, (choice, settings))] = followed
    assert who == "worker" and choice.target == "float16" and settings.target == "float16"
    assert runtime.scales_loss(settings)
    assert [r.getMessage() for r in caplog.records] == [
        "amp-rewrite: this worker (worker 1) of a multi-worker job asked for bfloat16 without loss scaling but "
        "runs float16 with dynamic loss scaling (from 32768, doubling after 2000 finite steps), as every worker "
        f"does: the chief (worker 0) chose it; {multi_worker.FIX}"]
    assert not coordinated


def test_a_worker_that_does_not_time_its_steps_follows_a_chief_that_does(coordinated, caplog):
    """Else it would run its half body in the calls where the chief's trial runs its float32 one."""
    store, followed = Store(), []
    agreements = [Agreement(RuntimeSettings(target="bfloat16", is_timing_steps=timed, peer_wait_seconds=1),
                            TargetChoice("bfloat16", "asked"), lambda *a: followed.append(a), store)
                  for timed in (True, False)]
    with caplog.at_level(logging.WARNING, "amp_rewrite"):
        agree_in_threads(agreements)
    [(choice, settings)] = followed
    assert choice.target == "bfloat16" and settings.is_timing_steps
    [line] = [r.getMessage() for r in caplog.records]
    assert "(worker 1) of a multi-worker job asked for bfloat16 without loss scaling but runs bfloat16 without " \
           "loss scaling and timed steps, as every worker does" in line


def test_strict_workers_that_differ_all_raise_and_stop_the_job(coordinated):
    store, raised = Store(), []
    agreements = [Agreement(RuntimeSettings(target=target, is_strict=strict, peer_wait_seconds=1),
                            TargetChoice(target, "asked"), lambda *a: pytest.fail("followed"), store)
                  for target, strict in (("float16", False), ("bfloat16", True))]

    def agree(agreement, index):
        try:
            agreement.agree(FakeStrategy(index))
        except RuntimeRewriteError as exc:
            raised.append(str(exc))

    threads = [threading.Thread(target=agree, args=(a, i)) for i, a in enumerate(agreements)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(raised) == 2 and len(set(raised)) == 1
    assert "AMP_REWRITE_STRICT=1 is set on worker 1" in raised[0]
    assert coordinated == ["amp-rewrite: " + raised[0]] * 2


def test_one_worker_and_tasks_outside_the_collectives_are_left_alone(coordinated):
    store = Store()
    agreement = Agreement(RuntimeSettings(target="float16"), TargetChoice("float16", "asked"),
                          lambda *a: pytest.fail("followed"), store)
    agreement.agree(FakeStrategy(0, workers=1))
    evaluator = FakeStrategy(0)
    evaluator.cluster_resolver.task_type = "evaluator"
    agreement.agree(evaluator)
    assert store.values == {}


def test_a_graph_mode_job_is_not_compared(monkeypatch, caplog):
    monkeypatch.setattr(multi_worker.tf_internals, "has_coordination_service", lambda: False)
    agreement = Agreement(RuntimeSettings(target="float16"), TargetChoice("float16", "asked"),
                          lambda *a: pytest.fail("followed"), Store())
    with caplog.at_level(logging.INFO, "amp_rewrite"):
        agreement.agree(FakeStrategy(1))
    assert agreement.verdict is None
    assert "not compared in a graph-mode multi-worker program" in caplog.records[0].getMessage()


def test_the_agreement_is_installed_even_when_this_machine_runs_float32(monkeypatch):
    from amp_rewrite.runtime import target as target_module

    monkeypatch.setattr(target_module, "cpu_flags", lambda: frozenset({"avx2"}))
    monkeypatch.setattr(target_module, "_tensorflow_gpus", lambda: [])
    original = tf.distribute.MultiWorkerMirroredStrategy.__init__
    runtime.disable()
    try:
        runtime.enable(settings=RuntimeSettings())
        assert runtime.current_target() is None and not runtime.is_enabled()
        assert [e.where for e in runtime.installed_changes()] == ["CollectiveAllReduceStrategy.__init__"]
        assert tf.distribute.MultiWorkerMirroredStrategy.__init__.__wrapped__ is original
    finally:
        runtime.disable()
    assert tf.distribute.MultiWorkerMirroredStrategy.__init__ is original


def test_following_the_job_swaps_the_runtimes_patches(monkeypatch):
    runtime.disable()
    try:
        runtime.enable(settings=RuntimeSettings(target="bfloat16"))
        ledger = runtime._ACTIVE.ledger
        assert runtime.loss_scaling() is None
        job = Decision("float16", DYNAMIC)
        runtime._follow_job(runtime._ACTIVE, TargetChoice("float16", "the job"),
                            job.settings_for(runtime.current_settings()))
        assert runtime.current_target() == "float16" and runtime.loss_scaling() is not None
        runtime._follow_job(runtime._ACTIVE, TargetChoice(None, "the job"), runtime.current_settings())
        assert runtime.current_target() is None and not runtime.is_enabled()
        assert runtime.loss_scaling() is None
        assert [e.name for e in runtime.installed_changes()] == [multi_worker.LEDGER_NAME]
    finally:
        runtime.disable()
    assert ledger.installed() == []


def test_a_tensorflow_without_the_store_runs_every_worker_float32_with_one_line(coordinated, monkeypatch, caplog):
    capability = multi_worker.tf_internals.MULTI_WORKER
    absent = capability.symbols[0].split(":")[0] + ":NoSuchStore"  # a module TensorFlow has, a name it lacks
    monkeypatch.setattr(multi_worker.tf_internals, "MULTI_WORKER",
                        replace(capability, symbols=capability.symbols + (absent,)))
    followed = []
    agreement = Agreement(RuntimeSettings(target="float16"), TargetChoice("float16", "asked"),
                          lambda *a: followed.append(a), Store())
    with caplog.at_level(logging.WARNING, "amp_rewrite"):
        agreement.agree(FakeStrategy(0))
    [(choice, _)] = followed
    assert choice.target is None
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("amp-rewrite: this worker (worker 0) of a multi-worker job asked for float16")
    assert f"but runs float32, as every worker does: TensorFlow {tf.__version__} lacks {absent}, which the " \
           "multi-worker agreement under amp-rewrite needs" in line


def test_uninstalling_all_but_one_name_keeps_its_entries_in_place():
    from amp_rewrite.runtime.ledger import Ledger

    class Owner:
        def first(self):
            return 1

        def second(self):
            return 2

    ledger = Ledger()
    ledger.install("kept", Owner, "first", lambda original, owner: original(owner) + 10)
    ledger.install("other", Owner, "second", lambda original, owner: original(owner) + 20)
    ledger.uninstall_all(keep="kept")
    assert (Owner().first(), Owner().second()) == (11, 2)
    assert [e.name for e in ledger.installed()] == ["kept"]
    ledger.uninstall_all()
    assert Owner().first() == 1 and ledger.installed() == []


# --- two worker processes -------------------------------------------------------------------

PEER_WAIT = "4"
HALF = {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_PEER_WAIT": PEER_WAIT}
# Step trials in bfloat16; the wait is long, so that a loaded machine never leaves a worker unheard
# (waited for only when a worker is late).
TIMED = {"AMP_REWRITE_TARGET": "bfloat16", "AMP_REWRITE_TUNE": "1", "AMP_REWRITE_PEER_WAIT": "30"}
SCENARIOS = {
    # name: the environment of worker 0 and of worker 1 (None: without amp-rewrite)
    "chief_only": ({**HALF, "AMP_REWRITE_TARGET": "float16"}, None),
    "worker1_only": (None, {**HALF, "AMP_REWRITE_TARGET": "float16"}),
    "float16_vs_bfloat16": ({**HALF, "AMP_REWRITE_TARGET": "float16"}, {**HALF, "AMP_REWRITE_TARGET": "bfloat16"}),
    "matched": ({**HALF, "AMP_REWRITE_TARGET": "float16"}, {**HALF, "AMP_REWRITE_TARGET": "float16"}),
    "strict_chief_only": ({**HALF, "AMP_REWRITE_TARGET": "float16", "AMP_REWRITE_STRICT": "1"}, None),
    # bfloat16 with step trials, whose clocks disagree: half wins on worker 0 and loses on worker 1
    "timers_disagree": ({**HALF, **TIMED, "FIXTURE_STEP_SECONDS": '{"half": 0.001, "float32": 0.002}'},
                        {**HALF, **TIMED, "FIXTURE_STEP_SECONDS": '{"half": 0.004, "float32": 0.002}'}),
}
# What mismatched workers died with before they agreed.
COLLECTIVE_ERRORS = ("Shape mismatch", "Collective instance")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Each scenario's two workers; two jobs run at a time (one's wait overlaps the other's work).

    A worker still running after 120 s is killed (and its test fails).
    """
    root = tmp_path_factory.mktemp("multi_worker")
    ports = iter(free_ports(2 * len(SCENARIOS)))
    jobs = {}
    for name, environments in SCENARIOS.items():
        cluster = {"worker": [f"localhost:{next(ports)}" for _ in environments]}
        jobs[name] = [
            Script("train_multiworker_tf2.py", ["--style", "keras_loop"], root / f"{name}{i}.json",
                   env={**(env or {}), **tuning_cache(env, root / f"{name}{i}-cache"),
                        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})})
            for i, env in enumerate(environments)]
    # A job's two workers are adjacent, so they start together.
    run_scripts(*(worker for workers in jobs.values() for worker in workers), parallel=4, timeout=120)
    return jobs


def tuning_cache(env, folder) -> dict:
    """A worker's own tuning cache, where its steps are timed (else the user's would be read)."""
    return {"AMP_REWRITE_TUNE_CACHE": str(folder)} if env and env.get("AMP_REWRITE_TUNE") == "1" else {}


def our_lines(worker):
    """The worker's lines about the agreement, and any other warning of amp-rewrite."""
    return [line for line in worker.stderr.splitlines()
            if "multi-worker" in line or ("amp-rewrite" in line and "WARNING" in line)]


def assert_trained_in(worker, target, *, loss_scale):
    result = worker.check().result
    assert result["target"] == target
    assert result["loss_scale"] == loss_scale
    halves = {op.split(":")[1] for op in result["half_ops"]}
    assert halves == ({target} if target else set())
    if target:
        assert f"MatMul:{target}" in result["half_ops"]
    assert not any(error in worker.stderr for error in COLLECTIVE_ERRORS)


@pytest.mark.parametrize("scenario, hooked, silent", [("chief_only", 0, 1), ("worker1_only", 1, 0)])
def test_a_worker_without_the_hook_leaves_the_job_in_float32_with_one_line(jobs, scenario, hooked, silent):
    workers = jobs[scenario]
    for worker in workers:
        assert_trained_in(worker, None, loss_scale=None)
    assert workers[hooked].result["hooked"] and not workers[silent].result["hooked"]
    assert our_lines(workers[hooked]) == [
        f"WARNING amp_rewrite.runtime.multi_worker: amp-rewrite: this worker (worker {hooked}) of a multi-worker "
        "job asked for float16 with dynamic loss scaling (from 32768, doubling after 2000 finite steps) but runs "
        f"float32, as every worker does: worker {silent} published no amp-rewrite setting within {PEER_WAIT} s "
        f"(without ENABLE_AUTO_MP=1 a worker runs float32); {multi_worker.FIX}"]
    assert workers[0].result["losses"] == workers[1].result["losses"]
    assert workers[0].result["losses"][-1] < 0.7 * workers[0].result["losses"][0]


def test_a_bfloat16_worker_follows_the_float16_chief_and_both_scale(jobs):
    chief, worker = jobs["float16_vs_bfloat16"]
    float32 = jobs["chief_only"][0].result["losses"]
    for each in (chief, worker):
        assert_trained_in(each, "float16", loss_scale=32768.0)
        np.testing.assert_allclose(each.result["losses"], float32, rtol=2e-2)
        assert each.result["losses"] != float32
    assert our_lines(chief) == []
    [line] = our_lines(worker)
    assert "this worker (worker 1) of a multi-worker job asked for bfloat16 without loss scaling but runs " \
           "float16 with dynamic loss scaling" in line
    assert "the chief (worker 0) chose it" in line


def test_matched_workers_train_as_before(jobs):
    float32 = jobs["chief_only"][0].result["losses"]
    for each in jobs["matched"]:
        assert_trained_in(each, "float16", loss_scale=32768.0)
        assert our_lines(each) == []
        np.testing.assert_allclose(each.result["losses"], float32, rtol=2e-2)
    assert jobs["matched"][0].result["losses"] == jobs["matched"][1].result["losses"]


def test_a_strict_worker_stops_the_whole_job_with_our_line(jobs):
    """The worker with the hook raises; the one without it is stopped in its first collective."""
    line = ("the workers of this multi-worker job differ (worker 0: float16 with dynamic loss scaling (from 32768, "
            "doubling after 2000 finite steps); worker 1: without amp-rewrite) and AMP_REWRITE_STRICT=1 is set on "
            f"worker 0: {multi_worker.FIX}")
    hooked, plain = jobs["strict_chief_only"]
    for worker in (hooked, plain):
        assert worker.returncode not in (0, None)
        assert "[killed after" not in worker.stderr
        assert not any(error in worker.stderr for error in COLLECTIVE_ERRORS)
    assert f"amp_rewrite.errors.RuntimeRewriteError: {line}" in hooked.stderr.splitlines()
    assert f"Collective ops is aborted by: amp-rewrite: {line}" in plain.stderr



def test_workers_whose_timers_disagree_keep_the_body_they_decided_together(jobs):
    """Alone, worker 0 would keep bfloat16 and worker 1 float32; together both keep float32, and finish."""
    workers = jobs["timers_disagree"]
    reason = "the step ran 4.0 ms in bfloat16 and 2.0 ms in float32 on the slowest of 2 workers"
    for worker in workers:
        worker.check()
        assert not any(error in worker.stderr for error in COLLECTIVE_ERRORS)
        assert worker.result["target"] == "bfloat16"
        assert worker.result["decisions"] == [["step", False, reason]]
        assert worker.result["half_ops"] == []  # the traced float32 body, on both
        assert f"amp-rewrite: tf.function step stays float32: {reason}" in worker.stderr
    assert workers[0].result["losses"] == workers[1].result["losses"]
    np.testing.assert_allclose(workers[0].result["losses"], jobs["chief_only"][0].result["losses"], rtol=2e-2)
