"""Every catalog model on every NVIDIA size: it plans with the recipe's flags, or it is refused
before anything is created, naming the field and the sizes that would serve it."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest
from pulumi_harness import run_program, stack_config
from test_droplet import merged

from components.host import phases, vllm_service
from components.spec import catalog, config
from components.spec.config import ConfigError

SUPER_FP8 = "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8"
NANO_4B = "nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16"
UTILIZATION = 0.90


def parse(model: str, size: str, **vllm: object) -> config.StackConfig:
    raw = merged(
        stack_config("dev"),
        {"model": {"id": model}, "droplet": {"size": size}, "vllm": {"maxModelLen": 32768, **vllm}},
    )
    return config.parse(raw, "dev")


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("size", catalog.NVIDIA_SIZES)
@pytest.mark.parametrize("model", list(catalog.MODELS))
def test_each_model_on_each_size_plans_with_its_flags_or_is_refused_with_the_sizes_that_fit(
    model: str, size: str
) -> None:
    known, gpu = catalog.MODELS[model], catalog.SIZES[size]
    fits = known.runs_on_arch(gpu) and known.vram_gb <= gpu.total_vram_gb * UTILIZATION
    if not fits:
        with pytest.raises(ConfigError) as err:
            parse(model, size)
        problem = next(p for p in err.value.problems if p.startswith("model.id:"))
        if known.blackwell_only:
            assert "run only on Blackwell GPUs" in problem and "per contract" in problem
        else:
            serving = [
                s.slug
                for s in catalog.SIZES.values()
                if s.vendor == "nvidia" and known.vram_gb <= s.total_vram_gb * UTILIZATION
            ]
            assert problem.endswith(", ".join(serving) or "none that DigitalOcean sells")
        return
    cfg = parse(model, size)
    args = vllm_service.serve_args(cfg)
    assert args[:2] == ["serve", model]
    # Tensor parallel over every GPU of the size; the recipe's flags, in order.
    assert flag(args, "--tensor-parallel-size") == str(gpu.gpu_count)
    start = args.index(known.vllm_flags[0])
    assert tuple(args[start : start + len(known.vllm_flags)]) == known.vllm_flags
    # 8-GPU (NVSwitch) sizes: Fabric Manager in the driver phase and its check after the reboot.
    assert phases.settings(cfg, "driver")["NEMO_FABRIC_MANAGER"] is gpu.nvswitch
    assert phases.settings(cfg, "reboot-wait")["NEMO_FABRIC_MANAGER"] is gpu.nvswitch


def test_the_family_tool_and_reasoning_parsers_come_from_the_recipes() -> None:
    parsers = {
        m.repo_id: (
            flag(list(m.vllm_flags), "--tool-call-parser"),
            flag(list(m.vllm_flags), "--reasoning-parser"),
        )
        for m in catalog.MODELS.values()
    }
    for repo, (tool, reasoning) in parsers.items():
        assert reasoning == "nemotron_v3", repo
        assert tool == ("qwen3_xml" if "-Super-" in repo else "qwen3_coder"), repo
        assert "--enable-auto-tool-choice" in catalog.MODELS[repo].vllm_flags


def test_ultra_is_served_by_no_digitalocean_size_and_says_so() -> None:
    with pytest.raises(ConfigError) as err:
        parse("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16", "gpu-h200x8-1128gb")
    assert any(
        "needs about 1320 GB of VRAM" in p
        and p.endswith("sizes that fit: none that DigitalOcean sells")
        for p in err.value.problems
    ), err.value.problems
    with pytest.raises(ConfigError) as err:
        parse("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4", "gpu-h200x8-1128gb")
    assert any(
        "NVFP4" in p and "Serve nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16 instead" in p
        for p in err.value.problems
    ), err.value.problems


def test_super_nvfp4_names_the_checkpoints_that_do_run_here() -> None:
    with pytest.raises(ConfigError) as err:
        parse("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4", "gpu-h100x8-640gb")
    (problem,) = [p for p in err.value.problems if p.startswith("model.id:")]
    assert problem.endswith(
        "Serve nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16 or "
        "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8 instead"
    )


def test_mtp_speculative_decoding_uses_the_recipe_tokens_or_the_configured_ones() -> None:
    cfg = parse(SUPER_FP8, "gpu-h100x8-640gb", speculative={"method": "mtp"})
    spec = json.loads(flag(vllm_service.serve_args(cfg), "--speculative-config"))
    assert spec == {"method": "mtp", "num_speculative_tokens": 3}
    cfg = parse(SUPER_FP8, "gpu-h100x8-640gb", speculative={"numSpeculativeTokens": 2})
    spec = json.loads(flag(vllm_service.serve_args(cfg), "--speculative-config"))
    assert spec == {"method": "mtp", "num_speculative_tokens": 2}
    # The unit's ExecStart keeps the JSON one argument (systemd quoting).
    unit = vllm_service.unit_text(cfg)
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert shlex.split(exec_start)[shlex.split(exec_start).index("--speculative-config") + 1] == (
        '{"method":"mtp","num_speculative_tokens":2}'
    )
    assert "--speculative-config" not in vllm_service.serve_args(
        parse(SUPER_FP8, "gpu-h100x8-640gb")
    )


def test_mtp_for_a_model_without_mtp_heads_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        parse(NANO_4B, "gpu-4000adax1-20gb", speculative={"method": "mtp"})
    assert any(
        p.startswith("vllm.speculative.method: mtp uses the model's own Multi-Token Prediction")
        and f"{NANO_4B} has none" in p
        for p in err.value.problems
    ), err.value.problems


@pytest.mark.parametrize(
    ("speculative", "message"),
    [
        (
            {"method": "eagle"},
            "vllm.speculative.method: Input should be 'mtp', 'dflash' or 'eagle3'",
        ),
        (
            {"method": "dflash", "model": "not a repo"},
            "vllm.speculative.model: 'not a repo': accepted: a Hugging Face repo id",
        ),
        (
            {"numSpeculativeTokens": 0},
            "vllm.speculative.numSpeculativeTokens: Input should be greater than or equal to 1",
        ),
        ({"tokens": 3}, "vllm.speculative.tokens: unknown key"),
    ],
)
def test_bad_speculative_input_names_the_field(speculative: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(SUPER_FP8, "gpu-h100x8-640gb", speculative=speculative)
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems


def test_a_context_past_the_default_needs_the_model_cards_consent_and_vllms() -> None:
    long = parse(SUPER_FP8, "gpu-h100x8-640gb", maxModelLen=1_048_576)
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in vllm_service.env_text("k" * 40, long)
    default = parse(SUPER_FP8, "gpu-h100x8-640gb", maxModelLen=262_144)
    assert "VLLM_ALLOW_LONG" not in vllm_service.env_text("k" * 40, default)
    with pytest.raises(ConfigError) as err:
        parse(SUPER_FP8, "gpu-h100x8-640gb", maxModelLen=1_048_577)
    assert any("accepted: 1 to 1048576" in p for p in err.value.problems)
    with pytest.raises(ConfigError) as err:  # Nano: no longer context than its default
        parse(NANO_4B, "gpu-4000adax1-20gb", maxModelLen=262_145)
    assert any("accepted: 1 to 262144" in p for p in err.value.problems)


def test_the_super_stack_plans_on_eight_h100s_with_mtp_and_a_cache() -> None:
    run = run_program(stack_config("super"), stack="super")
    assert run.error is None, run.error
    assert run.outputs["size"].value == "gpu-h100x8-640gb"
    stdin = next(r.inputs["stdin"] for r in run.registrations if r.name == "bootstrap-service")
    assert "--tensor-parallel-size 8" in stdin and "--tool-call-parser qwen3_xml" in stdin
    assert '{\\"method\\":\\"mtp\\",\\"num_speculative_tokens\\":3}' in stdin
    driver = next(r.inputs["stdin"] for r in run.registrations if r.name == "bootstrap-driver")
    assert "NEMO_FABRIC_MANAGER=true" in driver
    assert run.outputs["cache"].value["sizeGb"] == 180


SUPER_DRAFT = "RedHatAI/NVIDIA-Nemotron-3-Super-120B-A12B-speculator.dflash"
ULTRA_DRAFT = "RedHatAI/NVIDIA-Nemotron-3-Ultra-550B-A55B-speculator.dflash"


def test_a_draft_trained_for_the_model_is_rendered_and_downloaded_beside_it() -> None:
    cfg = parse(
        SUPER_FP8,
        "gpu-h100x8-640gb",
        speculative={"method": "dflash", "model": SUPER_DRAFT, "numSpeculativeTokens": 4},
    )
    spec = json.loads(flag(vllm_service.serve_args(cfg), "--speculative-config"))
    assert spec == {"method": "dflash", "model": SUPER_DRAFT, "num_speculative_tokens": 4}
    model = phases.settings(cfg, "model")
    assert model["NEMO_DRAFT_ID"] == SUPER_DRAFT and model["NEMO_DRAFT_DISK_GB"] == 10
    # No draft: the model phase downloads the weights alone.
    plain = phases.settings(parse(SUPER_FP8, "gpu-h100x8-640gb"), "model")
    assert plain["NEMO_DRAFT_ID"] == "" and plain["NEMO_DRAFT_DISK_GB"] == 0


@pytest.mark.parametrize(
    ("model", "speculative", "message"),
    [
        (
            SUPER_FP8,
            {"method": "dflash", "numSpeculativeTokens": 4},
            f"vllm.speculative.model: method dflash needs a draft model; drafts for {SUPER_FP8}: "
            f"{SUPER_DRAFT}",
        ),
        (
            SUPER_FP8,
            {"method": "dflash", "model": ULTRA_DRAFT, "numSpeculativeTokens": 4},
            f"vllm.speculative.model: {ULTRA_DRAFT} is not a dflash draft trained for {SUPER_FP8}",
        ),
        (
            SUPER_FP8,
            {"method": "dflash", "model": SUPER_DRAFT},
            "vllm.speculative.numSpeculativeTokens: required with method dflash",
        ),
        (
            SUPER_FP8,
            {"method": "mtp", "model": SUPER_DRAFT},
            "vllm.speculative.model: mtp uses the model's own heads, not a draft",
        ),
        (
            SUPER_FP8,
            {"method": "eagle3", "model": SUPER_DRAFT, "numSpeculativeTokens": 3},
            f"vllm.speculative.model: {SUPER_DRAFT} is not a eagle3 draft trained for {SUPER_FP8}; "
            "drafts for it: none in the catalog",
        ),
    ],
)
def test_a_draft_the_model_was_not_trained_with_is_refused(
    model: str, speculative: dict, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse(model, "gpu-h100x8-640gb", speculative=speculative)
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems


def test_a_vllm_older_than_the_recipe_minimum_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        parse(SUPER_FP8, "gpu-h100x8-640gb", version="0.16.0")
    assert any(
        p.startswith(f"vllm.version: {SUPER_FP8} needs vLLM >= 0.17.1; got 0.16.0")
        for p in err.value.problems
    ), err.value.problems


def test_nvfp4_is_refused_for_the_gpu_generation_not_for_its_name() -> None:
    """The refusal compares the checkpoint with the size's architecture: a Blackwell size, once
    DigitalOcean sells one and the catalog lists it, would serve NVFP4."""
    nvfp4 = catalog.MODELS["nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4"]
    hopper = catalog.SIZES["gpu-h100x8-640gb"]
    blackwell = dataclasses.replace(hopper, slug="gpu-b300x8", arch="blackwell")
    assert not nvfp4.runs_on_arch(hopper) and nvfp4.runs_on_arch(blackwell)
    assert catalog.MODELS[SUPER_FP8].runs_on_arch(hopper)


def test_weights_on_the_cache_volume_are_prefetched_unless_the_stack_chooses() -> None:
    """A Volume is network block storage, which vLLM's auto-prefetch does not detect (it looks
    for NFS and Lustre): the program asks for it; on the boot disk the line stays vLLM's own."""

    def strategy(cache: dict[str, object] | None = None, **vllm: object) -> str | None:
        raw = merged(stack_config("dev"), {"vllm": vllm, **({"cache": cache} if cache else {})})
        args = vllm_service.serve_args(config.parse(raw, "dev"))
        if "--safetensors-load-strategy" not in args:
            return None
        return flag(args, "--safetensors-load-strategy")

    volume = {"sizeGb": 60}
    assert strategy() is None
    assert strategy(volume) == "prefetch"
    assert strategy(volume, safetensorsLoadStrategy="lazy") == "lazy"
    assert strategy(safetensorsLoadStrategy="eager") == "eager"
    # The other loaders read the files their own way: no strategy applies. vLLM's multithreaded
    # loader refuses every strategy but lazy (default_loader.py): a loader config chooses alone.
    assert strategy(volume, loadFormat="instanttensor") is None
    threads = '{"enable_multithread_load": true, "num_threads": 8}'
    assert strategy(volume, extraArgs=["--model-loader-extra-config", threads]) is None
    assert strategy(volume, extraArgs=[f"--model-loader-extra-config={threads}"]) is None
    # A loader config that does not turn threads on leaves the default as it is.
    tracked = '{"enable_weights_track": true}'
    assert strategy(volume, extraArgs=["--model-loader-extra-config", tracked]) == "prefetch"


def test_a_chosen_strategy_the_multithreaded_loader_refuses_is_refused_before_anything() -> None:
    raw = merged(stack_config("dev"), {"vllm": {
        "safetensorsLoadStrategy": "prefetch",
        "extraArgs": ["--model-loader-extra-config", '{"enable_multithread_load": true}'],
    }})  # fmt: skip
    with pytest.raises(ConfigError) as err:
        config.parse(raw, "dev")
    assert any(
        p.startswith("vllm.safetensorsLoadStrategy: prefetch with the multithreaded loader")
        for p in err.value.problems
    ), err.value.problems
    raw["vllm"]["safetensorsLoadStrategy"] = "lazy"
    config.parse(raw, "dev")


def test_weights_past_vllms_memory_bound_are_not_prefetched_where_the_memory_is_known() -> None:
    """vLLM skips its own 90% guard when prefetch is asked for: the program asks only where the
    weights fit (the catalog documents the H100x1's 240 GiB)."""
    memory = catalog.SIZES["gpu-h100x1-80gb"].memory_gib
    assert memory == 240

    def args(disk_gb: int) -> list[str]:
        raw = merged(stack_config("prod"), {
            "model": {"id": "someorg/custom-model", "vramGb": 60, "diskGb": disk_gb},
            "cache": {"sizeGb": 400},
        })  # fmt: skip
        return vllm_service.serve_args(config.parse(raw, "prod"))

    assert flag(args(int(0.9 * memory)), "--safetensors-load-strategy") == "prefetch"
    assert "--safetensors-load-strategy" not in args(int(0.9 * memory) + 1)
