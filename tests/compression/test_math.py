"""Pure math: full-rank factorisations reproduce W; whitening falls back cleanly; SVD-LLM minimises output error."""

from __future__ import annotations

import logging

import pytest
import torch

from gac.compression.compressors.lowrank_math import asvd_factors, svd_factors, svdllm_factors, whitening
from gac.compression.compressors.pruning_math import channel_order, kept_channels
from gac.errors import GacError


@pytest.fixture
def W():
    g = torch.Generator().manual_seed(0)
    return torch.randn(48, 32, generator=g)


@pytest.fixture
def X():
    g = torch.Generator().manual_seed(1)
    return torch.randn(200, 32, generator=g) * torch.linspace(0.1, 3.0, 32)


def test_full_rank_reproduces_weight(W, X):
    A, B = svd_factors(W)
    torch.testing.assert_close(A @ B, W, atol=1e-5, rtol=1e-5)
    A, B = asvd_factors(W, X.abs().mean(0), alpha=0.5)
    torch.testing.assert_close(A @ B, W, atol=1e-5, rtol=1e-5)
    A, B, how = svdllm_factors(W, X.double().T @ X.double())
    assert how == "cholesky"
    torch.testing.assert_close(A @ B, W, atol=1e-4, rtol=1e-4)
    assert A.shape == (48, 32) and B.shape == (32, 32)


def test_plain_svd_truncation_matches_torch(W):
    A, B = svd_factors(W, max_rank=10)
    U, S, Vh = torch.linalg.svd(W.double(), full_matrices=False)
    ref = (U[:, :10] * S[:10]) @ Vh[:10]
    torch.testing.assert_close((A @ B).double(), ref, atol=1e-5, rtol=1e-5)
    # rank-r prefixes of the stored factors are the rank-r truncations
    A5, B5 = svd_factors(W, max_rank=5)
    torch.testing.assert_close(A[:, :5] @ B[:5], A5 @ B5, atol=1e-5, rtol=1e-5)


def test_svdllm_minimises_output_error(W, X):
    r = 8
    A, B = svd_factors(W, max_rank=r)
    As, Bs, _ = svdllm_factors(W, X.double().T @ X.double(), max_rank=r)
    Aa, Ba = asvd_factors(W, X.abs().mean(0), max_rank=r)
    err = lambda a, b: torch.linalg.norm(X @ (W - a @ b).T)  # noqa: E731
    assert err(As, Bs) < err(A, B)
    assert err(As, Bs) <= err(Aa, Ba) + 1e-4
    assert torch.linalg.norm(W - A @ B) < torch.linalg.norm(W - As @ Bs)  # plain SVD is best in weight space


def test_whitening_fallback_on_singular_gram(W, caplog):
    X = torch.randn(5, 32, generator=torch.Generator().manual_seed(2))  # 5 tokens < 32 channels: X^T X singular
    C = X.double().T @ X.double()
    C[3, 3] = -1.0  # not even PSD
    with caplog.at_level(logging.WARNING):
        L, how = whitening(C, eps=1e-12, name="layers.0.q_proj", tries=2)
    assert how.startswith("eigh")
    assert "layers.0.q_proj" in caplog.text
    A, B, how = svdllm_factors(W, C, eps=1e-12)
    assert torch.isfinite(A).all() and torch.isfinite(B).all()
    torch.testing.assert_close(A @ B, W, atol=1e-3, rtol=1e-3)  # full rank still reproduces W


def test_whitening_regularised_cholesky(W):
    X = torch.randn(10, 32, generator=torch.Generator().manual_seed(3))
    L, how = whitening(X.double().T @ X.double(), eps=1e-9)
    assert "cholesky" in how and torch.isfinite(L).all()


def test_nan_inputs_fail_loudly(W, X):
    bad = W.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(GacError, match="mlp.up_proj"):
        svd_factors(bad, name="mlp.up_proj")
    C = X.double().T @ X.double()
    C[0, 1] = float("inf")
    with pytest.raises(GacError, match="X\\^T X"):
        whitening(C, name="attn.k_proj")
    a = X.abs().mean(0)
    a[2] = float("nan")
    with pytest.raises(GacError, match="attn.v_proj"):
        asvd_factors(W, a, name="attn.v_proj")


def test_channel_order_and_keep():
    e = torch.tensor([0.5, 3.0, 1.0, 3.0, 0.0])
    order = channel_order(e)
    assert order.tolist() == [1, 3, 2, 0, 4]
    assert kept_channels(order, 3).tolist() == [1, 2, 3]
    with pytest.raises(GacError):
        channel_order(torch.tensor([1.0, float("nan")]))
