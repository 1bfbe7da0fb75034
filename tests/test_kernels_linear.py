"""The fused LM-head log-prob against hidden @ W^T + log_softmax in fp64: values and the
gradients of hidden, weight and bias, with the rows split into several chunks."""
import pytest
import torch
import torch.nn.functional as F

from grpo_bench.numerics.kernels.linear import default_rows, fused_linear_logprobs
from helpers import needs

needs("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}


def reference(hidden, weight, bias, labels, temperature=1.0):
    z = F.linear(hidden.double(), weight.double(), None if bias is None else bias.double())
    lp = torch.log_softmax(z / temperature, -1)
    p = lp.exp()
    return lp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(p * lp).sum(-1)


def inputs(b, l, h, v, dtype, with_bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, l, h, generator=gen, dtype=torch.float32)
    weight = torch.randn(v, h, generator=gen, dtype=torch.float32) / h ** 0.5 * 2
    bias = torch.randn(v, generator=gen, dtype=torch.float32) if with_bias else None
    labels = torch.randint(0, v, (b, l), generator=gen)
    cast = [t if t is None else t.to(dtype).to(DEVICE) for t in (hidden, weight, bias)]
    return (*cast, labels.to(DEVICE))


@pytest.mark.parametrize("use_triton", [False, True], ids=["chunked", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias,temperature", [(False, 1.0), (True, 1.0), (False, 0.7)],
                         ids=["", "bias", "T0.7"])
def test_matches_fp64_reference(use_triton, dtype, with_bias, temperature):
    hidden, weight, bias, labels = inputs(2, 5, 16, 100, dtype, with_bias)
    leaves = [t.clone().requires_grad_() for t in (hidden, weight) + ((bias,) if with_bias else ())]
    lp, ent = fused_linear_logprobs(leaves[0], leaves[1], labels, with_entropy=True,
                                    bias=leaves[2] if with_bias else None, use_triton=use_triton, rows=3,
                                    temperature=temperature)
    rleaves = [t.detach().double().requires_grad_() for t in leaves]
    rlp, rent = reference(rleaves[0], rleaves[1], rleaves[2] if with_bias else None, labels, temperature)
    # values: bf16 inputs give bf16 logits before the fp32 softmax, as in a bf16 model
    vtol = TOL[dtype] if dtype != torch.float32 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lp.double(), rlp, **vtol)
    torch.testing.assert_close(ent.double(), rent, **vtol)
    a = torch.randn(labels.shape, dtype=torch.float64, device=DEVICE)
    grads = torch.autograd.grad((lp.double() * a).sum() + ent.double().sum(), leaves)
    rgrads = torch.autograd.grad((rlp * a).sum() + rent.sum(), rleaves)
    for g, rg, leaf in zip(grads, rgrads, leaves):
        assert g.dtype == leaf.dtype and g.shape == leaf.shape
        scale = rg.abs().max().item()  # compare relative to the tensor's largest entry
        torch.testing.assert_close(g.double() / scale, rg / scale, **TOL[dtype])


def test_hidden_only_and_odd_chunks():
    # weight frozen: no dW work; chunks of 4 rows over 3 x 7 = 21 rows
    hidden, weight, _, labels = inputs(3, 7, 8, 33, torch.float32, False, seed=1)
    for use_triton in (False, True):
        x = hidden.clone().requires_grad_()
        lp, ent = fused_linear_logprobs(x, weight, labels, use_triton=use_triton, rows=4)
        assert ent is None
        xr = hidden.double().requires_grad_()
        rlp, _ = reference(xr, weight, None, labels)
        torch.testing.assert_close(lp.double(), rlp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.autograd.grad(lp.sum(), x)[0].double(),
                                   torch.autograd.grad(rlp.sum(), xr)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_triton", [False, True], ids=["chunked", "triton"])
def test_temperature_divides_the_fp32_logits(use_triton):
    # the sampler divides fp32(bf16 logits) by T; dividing the bf16 hidden states by T first
    # rounds them to other values, which the comparison below must be able to tell apart
    hidden, weight, _, labels = inputs(3, 4, 32, 50, torch.bfloat16, False, seed=3)
    x = hidden.clone().requires_grad_()
    lp, ent = fused_linear_logprobs(x, weight, labels, with_entropy=True, use_triton=use_triton, rows=5,
                                    temperature=0.7)
    xr = hidden.clone().requires_grad_()
    want = torch.log_softmax(F.linear(xr, weight).float() / 0.7, -1)
    rlp = want.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    rent = -(want.exp() * want).sum(-1)
    torch.testing.assert_close(lp, rlp, rtol=0, atol=2e-6)
    torch.testing.assert_close(ent, rent, rtol=0, atol=2e-6)
    wrong = torch.log_softmax(F.linear(hidden / 0.7, weight).float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert (wrong - rlp).abs().max() > 1e-3
    # the gradient: autograd through the fp32 division, cast back to bf16 at the GEMM
    a = torch.randn(labels.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    (g,) = torch.autograd.grad((lp * a).sum() + ent.sum(), x)
    (rg,) = torch.autograd.grad((rlp * a).sum() + rent.sum(), xr)
    torch.testing.assert_close(g.float(), rg.float(), rtol=2e-2, atol=2e-2 * rg.abs().max().item())


def test_chunk_rule():
    # GPU: a sixteenth of the rows, capped at 1 GiB of fp32 logits (1,766 rows of 151,936),
    # never below Liger's rule (logits about the size of the hidden states), within [1, N]
    assert default_rows(8192, 151_936, 896, "cuda") == 512
    assert default_rows(131_072, 151_936, 896, "cuda") == (1 << 30) // (4 * 151_936) == 1766
    assert default_rows(16, 151_936, 896, "cuda") == 1  # n / 16 = 1 = Liger's rule here
    assert default_rows(1024, 50_257, 8192, "cuda") == 256  # Liger: 1024 / ceil(50,257 / 8,192) -> 256 > 64
    assert default_rows(8, 10, 1000, "cuda") == 8
    assert default_rows(1, 50_257, 64, "cuda") == 1
    # CPU: 64 rows for the GEMM's sake, never above N / 16 (nor below 1), the whole of small logits
    assert default_rows(8192, 151_936, 128, "cpu") == 64
    assert default_rows(320, 151_936, 128, "cpu") == 20
    assert default_rows(5, 151_936, 128, "cpu") == 1
    assert default_rows(1024, 52, 128, "cpu") == 1024


@pytest.mark.skipif(not torch.cuda.is_available(), reason="full-size kernel checks need a GPU")
def test_full_size_gpu():
    hidden, weight, _, labels = inputs(4, 1024, 896, 151_936, torch.bfloat16, False, seed=2)
    x, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lp, _ = fused_linear_logprobs(x, w, labels, use_triton=True)
    xr, wr = hidden.float().requires_grad_(), weight.float().requires_grad_()
    rlp = torch.log_softmax(F.linear(xr, wr).float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(lp, rlp, rtol=3e-2, atol=3e-2)
    gx, gw = torch.autograd.grad(lp.sum(), (x, w))
    rgx, rgw = torch.autograd.grad(rlp.sum(), (xr, wr))
    for g, rg in ((gx, rgx), (gw, rgw)):
        s = rg.abs().max()
        torch.testing.assert_close(g.float() / s, rg / s, rtol=3e-2, atol=3e-2)
