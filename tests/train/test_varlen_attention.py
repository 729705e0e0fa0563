"""Packed rows without a dense mask: the sample bounds read from positions, the per-sample attention
against one masked SDPA call over the whole row (a second implementation), and a model switched to it
giving the padded sdpa model's outputs for padded inputs (generation) and for the same samples packed
(the update)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from balcaprl.train import varlen_attention
from balcaprl.train.varlen_attention import VARLEN, cumulative_lengths, packed_attention


def test_cumulative_lengths_by_hand():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    assert cumulative_lengths(positions).tolist() == [0, 3, 5, 9]
    assert cumulative_lengths(torch.arange(4)[None]).tolist() == [0, 4]  # one sample


def block_diagonal_reference(query, key, value, lengths, scale, causal=True):
    """One SDPA call with the dense block-diagonal (causal) mask transformers builds under sdpa."""
    sample = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    place = torch.arange(sum(lengths))
    mask = sample[:, None] == sample[None, :]
    if causal:
        mask &= place[:, None] >= place[None, :]
    groups = query.shape[1] // key.shape[1]
    key, value = (x.repeat_interleave(groups, dim=1) for x in (key, value))
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale).transpose(1, 2)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=2, max_size=5),
    kv_heads=st.sampled_from([1, 2, 4]),
    causal=st.booleans(),  # the language model's samples, or the vision tower's windows
)
def test_per_sample_attention_equals_the_block_diagonal_mask(lengths, kv_heads, causal):
    torch.manual_seed(len(lengths))
    heads, dim, tokens = 4, 8, sum(lengths)
    query = torch.randn(1, heads, tokens, dim, dtype=torch.float64)
    key, value = (torch.randn(1, kv_heads, tokens, dim, dtype=torch.float64) for _ in range(2))
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    got = packed_attention(query, key, value, cumulative_lengths(positions), scaling=0.3, causal=causal)
    torch.testing.assert_close(got, block_diagonal_reference(query, key, value, lengths, 0.3, causal))


def qwen_text_model():
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLTextModel

    config = Qwen2_5_VLTextConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=50, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]},
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2_5_VLTextModel(config).double()


def test_a_switched_model_gives_sdpa_outputs_padded_and_packed(monkeypatch):
    model = qwen_text_model()
    lengths = [5, 3, 7]
    ids = torch.randint(0, 50, (3, 7))
    mask = torch.tensor([[1] * n + [0] * (7 - n) for n in lengths])
    padded = model(input_ids=ids, attention_mask=mask).last_hidden_state  # sdpa, padding mask
    flat = torch.cat([ids[i, :n] for i, n in enumerate(lengths)])[None]
    text = torch.cat([torch.arange(n) for n in lengths])[None]
    positions = torch.cat([text[None], text[None].expand(3, -1, -1)])

    calls = []
    real = varlen_attention.packed_attention
    monkeypatch.setattr(varlen_attention, "packed_attention", lambda *a: calls.append(a[3]) or real(*a))
    assert varlen_attention.use_varlen_text_attention(model)
    assert model.config._attn_implementation == VARLEN
    assert not calls
    torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).last_hidden_state, padded)
    assert not calls  # padded inputs keep sdpa and its mask
    packed = model(input_ids=flat, position_ids=positions).last_hidden_state
    assert len(calls) == 2 and calls[0].tolist() == [0, 5, 8, 15]  # each layer, bounds from positions
    real_rows = torch.cat([padded[i, :n] for i, n in enumerate(lengths)])[None]
    torch.testing.assert_close(packed, real_rows)


@pytest.mark.parametrize("implementation", ["eager", "flash_attention_2"])
def test_other_implementations_are_left_alone(implementation):
    model = qwen_text_model()
    model.config._attn_implementation = implementation
    assert not varlen_attention.use_varlen_text_attention(model)
    assert model.config._attn_implementation == implementation


def fake_varlen_kernel(newer: bool):
    """A stand-in for torch's CUDA-only ``varlen_attn`` with its [tokens, heads, d] layout: the current
    signature (scale, window_size, enable_gqa) or an older one (is_causal only)."""

    def attend(q, k, v, cu, causal, scale):
        groups = q.shape[1] // k.shape[1]
        k, v = (x.repeat_interleave(groups, dim=1) for x in (k, v))
        bounds = cu.tolist()
        outs = [
            F.scaled_dot_product_attention(
                *(x[s:e].transpose(0, 1) for x in (q, k, v)), is_causal=causal, scale=scale
            ).transpose(0, 1)
            for s, e in zip(bounds[:-1], bounds[1:], strict=False)
        ]
        return torch.cat(outs)

    if newer:

        def varlen_attn(
            q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False
        ):
            assert enable_gqa or q.shape[1] == k.shape[1]
            return attend(q, k, v, cu_q, window_size == (-1, 0), scale)

    else:

        def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False):
            assert q.shape[1] == k.shape[1]  # no GQA: k and v come expanded
            return attend(q, k, v, cu_q, is_causal, None)

    return varlen_attn


@pytest.mark.parametrize("newer", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_the_cuda_kernel_gets_its_layout_and_arguments(monkeypatch, newer, causal):
    """The kernel route (CUDA) against the per-sample reference, with torch's kernel replaced by a
    stand-in of the same signature: layout, causality, GQA and the scale are passed as it takes them."""
    monkeypatch.setattr(varlen_attention, "varlen_route", lambda device: "torch")
    monkeypatch.setattr(varlen_attention, "_kernel", lambda: ("torch", fake_varlen_kernel(newer)))
    torch.manual_seed(3)
    lengths = [4, 7, 2]
    query = torch.randn(1, 4, 13, 8, dtype=torch.float64)
    key, value = (torch.randn(1, 2, 13, 8, dtype=torch.float64) for _ in range(2))
    cu = torch.tensor([0, 4, 11, 13], dtype=torch.int32)
    got = packed_attention(query, key, value, cu, scaling=0.2, causal=causal)
    expected = block_diagonal_reference(query, key, value, lengths, 0.2, causal)
    torch.testing.assert_close(got, expected)
