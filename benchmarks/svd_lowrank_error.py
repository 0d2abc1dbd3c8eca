"""ASVD parity on smollm2 (docs/compressors.md): the relative Frobenius error of a rank-r approximation of
SmolLM2-135M's weights, exact truncated SVD against the ASVD reference's ``torch.svd_lowrank(W, q=r)`` (seed 0), at
ASVD's rank for kept parameter ratio g, ``int(g * out * in) // (out + in)``.

    python benchmarks/svd_lowrank_error.py        # ~7 s on one CPU thread
"""

import torch

from gac.models import load_model


def main() -> None:
    torch.set_num_threads(1)
    model, _ = load_model("smollm2", dtype=torch.float32)
    for li in (0, 15, 29):
        for n in ("self_attn.q_proj", "self_attn.k_proj", "mlp.gate_proj", "mlp.down_proj"):
            W = model.get_submodule(f"model.layers.{li}.{n}").weight.detach().float()
            s = torch.linalg.svdvals(W)
            for g in (0.5, 0.8):
                r = int(g * W.numel()) // sum(W.shape)
                exact = float(s[r:].square().sum().sqrt() / s.square().sum().sqrt())
                torch.manual_seed(0)
                U, S, V = torch.svd_lowrank(W, q=r)
                rnd = float(torch.linalg.norm(W - U @ torch.diag(S) @ V.T) / torch.linalg.norm(W))
                print(f"layer {li} {n} kept {g}: rank {r}, exact {exact:.4f}, svd_lowrank {rnd:.4f} "
                      f"({rnd / exact:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
