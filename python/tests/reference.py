"""A float64 numpy reference of docs/DESIGN.md "The math", token by token (masks, no blocks of
computation, no online softmax). Used by the tests only."""

from __future__ import annotations

import numpy as np


def _block_kept(bs, nb: int) -> np.ndarray:
    """[nb, nb] bool: key block j kept for query block i (not for `random`)."""
    i = np.arange(nb)[:, None]
    j = np.arange(nb)[None, :]
    d = np.abs(i - j)
    gen = bs.WhichOneof("generator")
    if gen == "local_window":
        return d <= bs.local_window.width
    if gen == "dilated_sparse":
        return (i == j) | np.isin(d, list(bs.dilated_sparse.rates))
    if gen == "global_local":
        g = bs.global_local
        return (i < g.global_blocks) | (j < g.global_blocks) | (d <= g.width)
    if gen == "strided":
        s = bs.strided
        return (d <= s.width) | (((i - j) % s.stride == 0) if s.stride > 0 else False)
    if gen == "csr":
        kept = np.zeros((nb, nb), dtype=bool)
        rp, ci = list(bs.csr.row_ptr), list(bs.csr.col_idx)
        for row in range(min(nb, len(rp) - 1)):
            for e in range(rp[row], rp[row + 1]):
                if ci[e] < nb:
                    kept[row, ci[e]] = True
        return kept
    raise ValueError(f"reference: generator {gen} not modelled")


def _softmax_rows(scores: np.ndarray, mask: np.ndarray, v: np.ndarray):
    """scores [H, Nq, Nkv], mask broadcastable, v [H, Nkv, D] -> O [H, Nq, D], LSE [H, Nq]."""
    s = np.where(mask, scores, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    denom = p.sum(axis=-1, keepdims=True)
    empty = denom[..., 0] == 0
    o = np.einsum("hqk,hkd->hqd", p, v) / np.where(denom == 0, 1.0, denom)
    lse = np.where(empty, -np.inf, np.log(np.where(empty, 1.0, denom[..., 0])) + m_safe[..., 0])
    o[empty] = 0.0
    return o, lse


def attention(q, k, v, spec, q_offset: int = 0):
    """q [B, Nq, Hq, D], k/v [B, Nkv, Hkv, D] (float arrays), spec a pb.AttentionSpec.
    Returns O [B, Nq, Hq, D] and LSE [B, Hq, Nq], float64."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return _attention(q, k, v, spec, q_offset)


def _attention(q, k, v, spec, q_offset):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, Nq, Hq, D = q.shape
    Nkv, Hkv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    scale = spec.scale if spec.scale else 1.0 / np.sqrt(D)
    p = q_offset + np.arange(Nq)[:, None]  # query positions
    j = np.arange(Nkv)[None, :]  # key positions
    causal = (j <= p) if spec.causal else np.ones((Nq, Nkv), dtype=bool)
    E = max(q_offset + Nq, Nkv)
    kind = spec.WhichOneof("pattern") or "dense"
    o = np.zeros((B, Nq, Hq, D))
    lse = np.full((B, Hq, Nq), -np.inf)
    for b in range(B):
        qh = q[b].transpose(1, 0, 2)  # [Hq, Nq, D]
        kh = np.repeat(k[b].transpose(1, 0, 2), g, axis=0)  # [Hq, Nkv, D]
        vh = np.repeat(v[b].transpose(1, 0, 2), g, axis=0)
        scores = np.einsum("hqd,hkd->hqk", qh, kh) * scale
        if kind == "dilated":
            ob, lb = _dilated(scores, vh, spec.dilated, p, j, causal, Hq)
        else:
            if kind == "dense":
                mask = causal
            elif kind == "window":
                mask = causal & (np.abs(p - j) <= spec.window.size)
            else:
                bsz = spec.block_sparse.block_size
                kept = _block_kept(spec.block_sparse, -(-E // bsz))
                mask = causal & kept[p // bsz, j // bsz]
            ob, lb = _softmax_rows(scores, mask[None], vh)
        o[b] = ob.transpose(1, 0, 2)
        lse[b] = lb
    return o, lse


def _dilated(scores, vh, dil, p, j, causal, H):
    """Branches merged by their softmax denominators: L = log sum exp(LSE_k),
    O = sum exp(LSE_k - L) O_k."""
    Nq, Nkv = scores.shape[1], scores.shape[2]
    lses, outs = [], []
    for w, r in zip(dil.segment_lengths, dil.dilation_rates):
        masks = []
        for h in range(H):
            off = h % r

            def in_set(x):
                rel = x % w - off
                return (rel >= 0) & (rel % r == 0)

            masks.append(in_set(p) & in_set(j) & (p // w == j // w) & causal)
        ob, lb = _softmax_rows(scores, np.stack(masks), vh)
        outs.append(ob)
        lses.append(lb)
    L = np.stack(lses)  # [branches, H, Nq]
    m = L.max(axis=0)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    total = np.exp(L - m_safe).sum(axis=0)
    empty = total == 0
    lse = np.where(empty, -np.inf, m_safe + np.log(np.where(empty, 1.0, total)))
    o = np.zeros_like(outs[0])
    for lb, ob in zip(lses, outs):
        wgt = np.where(empty, 0.0, np.exp(lb - np.where(empty, 0.0, lse)))
        o += wgt[..., None] * ob
    del Nq, Nkv
    return o, lse


def max_rel_error(o, ref) -> float:
    """max |O - ref| / max |ref| (what attnctl --check reports)."""
    o = np.asarray(o, dtype=np.float64)
    return float(np.abs(o - ref).max() / max(np.abs(ref).max(), 1e-30))


def max_lse_error(lse, ref) -> float:
    lse = np.asarray(lse, dtype=np.float64)
    both_inf = np.isneginf(lse) & np.isneginf(ref)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref)), "rows without keys differ"
    return float(np.abs(np.where(both_inf, 0.0, lse - np.where(both_inf, 0.0, ref))).max())
