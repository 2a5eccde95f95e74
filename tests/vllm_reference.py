"""vLLM's sampler code path for processed logprobs, re-implemented from its logic (v1
``Sampler`` + ``TopKTopPSampler.forward_native`` with ``logprobs_mode="processed_logprobs"``),
independent of detsample: the tests' "engine that is not detsample".

``logits.div_(temperature)``; min-p (a logits processor, before top-k/top-p): ``softmax``,
tokens with ``p < min_p * max p`` to ``-inf``; ``apply_top_k_top_p``: an ascending sort,
the top-k boundary value masked below, ``softmax`` + ``cumsum`` of the sorted row,
``cumsum <= 1 - top_p`` masked (the last, largest, never), scattered back; then
``logits.log_softmax(dim=-1)``.
"""

import torch

NEG_INF = float("-inf")


def vllm_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = torch.softmax(logits, dim=-1)
    adjusted = torch.amax(probs, dim=-1, keepdim=True) * min_p
    return logits.masked_fill(probs < adjusted, NEG_INF)


def vllm_top_k_top_p(logits: torch.Tensor, k: int | None, p: float | None) -> torch.Tensor:
    """vLLM's ``apply_top_k_top_p`` (the sort-based path) for one setting of k and p."""
    if k is None and p is None:
        return logits
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        boundary = logits_sort.gather(1, torch.full((logits.shape[0], 1), logits.shape[1] - k))
        logits_sort = logits_sort.masked_fill(logits_sort < boundary, NEG_INF)
    if p is not None:
        probs_sum = torch.cumsum(logits_sort.softmax(dim=-1), dim=-1)
        top_p_mask = probs_sum <= 1 - torch.tensor(p, dtype=torch.float32)
        top_p_mask[:, -1] = False
        logits_sort = logits_sort.masked_fill(top_p_mask, NEG_INF)
    return logits.scatter(dim=-1, index=logits_idx, src=logits_sort)


def vllm_processed(
    logits: torch.Tensor, t: float, k: int, p: float, min_p: float, *, log_softmax=lambda x: x.log_softmax(dim=-1)
) -> torch.Tensor:
    """vLLM's processed logprobs; ``log_softmax``: the final step's kernel (torch's, as
    vLLM runs it, or another one applied to the same masked logits)."""
    x = logits.clone().div_(torch.tensor([[t]], dtype=torch.float32))
    if min_p > 0:
        x = vllm_min_p(x, min_p)
    x = vllm_top_k_top_p(x, None if k == -1 else k, None if p == 1.0 else p)
    return log_softmax(x)


def vllm_engine_rollouts(
    model, prompts, *, temperature: float, top_p: float, max_new_tokens: int, seed: int
) -> list[dict]:
    """Rollouts of a Hugging Face causal LM by a plain loop that is not detsample's:
    one full forward per step (no KV cache), the step's logits through
    :func:`vllm_processed`, the token drawn by ``torch.multinomial`` from the processed
    distribution, its processed logprob reported (what vLLM writes with
    ``logprobs_mode="processed_logprobs"``)."""
    gen = torch.Generator().manual_seed(seed)
    records = []
    for i, prompt in enumerate(prompts):
        ids, lps = list(prompt), []
        with torch.no_grad():
            for _ in range(max_new_tokens):
                logits = model(torch.tensor([ids])).logits[:, -1, :].float()
                lp = vllm_processed(logits, temperature, -1, top_p, 0.0)[0]
                tok = int(torch.multinomial(lp.exp(), 1, generator=gen))
                ids.append(tok)
                lps.append(float(lp[tok]))
        records.append(
            {"id": f"vllm-{i}", "prompt_ids": list(prompt), "response_ids": ids[len(prompt) :], "engine_logprobs": lps}
        )
    return records
