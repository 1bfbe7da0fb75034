"""The LM tasks' passes over a rollout: log-probs (and entropy) and sum pi^2 of the responses under the policy or
the reference, through the fused head or the materialised logits, each prompt once for its group where
`model.shared_prefix` asks.

A mixin of the arithmetic task (grpo_bench/tasks/arithmetic.py), whose gym tasks inherit it. It reads the task's
policy, its stacked adapters (`layers`, lm/stacked.py), configs and seeds; it imports neither transformers nor
peft, so listing tasks does not pay for them.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ...numerics import rng
from .. import Rollout


class Passes:
    """Forward passes of a causal LM with one LoRA adapter per population member over a rollout."""

    def _prompt_once(self, ids: Tensor, attn: Tensor, responses: Tensor, mask: Tensor, group: int) -> Tensor:
        """model.shared_prefix: what predicts each response token -- the last hidden states (fused path) or the
        logits (N, T, ...) -- with each prompt run once for its `group` consecutive rows and its keys and values
        repeated to them, as the sampler's shared prefill does: the same numbers as one pass over prompt and
        response (causal attention: a prompt's states never see its responses), to rounding, on 1/group of the
        prompt tokens. Gradients reach the prompt's adapters through its repeated cache, summed over the group."""
        t = responses.shape[1]
        model = self._models._hf_model(self.policy).base_model if self._fused else self.policy
        key, keep = ("last_hidden_state", {}) if self._fused else ("logits", {"logits_to_keep": 1})
        ids_1, attn_1 = ids[::group], attn[::group]
        first = model(input_ids=ids_1, attention_mask=attn_1, position_ids=self._models.positions(attn_1),
                      use_cache=True, **keep)
        cache = getattr(first, self._stacked._CACHE)
        cache.batch_repeat_interleave(group)
        full_mask = torch.cat([attn, mask.to(attn.dtype)], 1)
        rest = model(input_ids=responses, attention_mask=full_mask, position_ids=self._models.positions(full_mask)[:, -t:],
                     use_cache=True, **{self._stacked._CACHE: cache})
        # position P-1 (the prompt's last) predicts the first response token, response position j the (j+1)-th
        return torch.cat([getattr(first, key)[:, -1:].repeat_interleave(group, 0), getattr(rest, key)[:, :-1]], 1)

    def _through_head(self, ids: Tensor, attn: Tensor, responses: Tensor, mask: Tensor, on_head, on_logits,
                      group: int):
        """The model's last hidden states of responses (N, T) after prompts (N, P), handed to
        on_head(hidden, weight, bias, labels) -- once, or per member with an adapter on the head,
        a list then -- on the fused path; else its (N, T, V) logits to on_logits(logits). Rows come in
        runs of `group` with the same prompt (a rollout's responses to one prompt)."""
        t = responses.shape[1]
        shared = self.cfg.model.shared_prefix and group > 1
        full = torch.cat([ids, responses], 1)                            # (N, P+T)
        full_mask = torch.cat([attn, mask.to(attn.dtype)], 1)
        inputs = dict(input_ids=full, attention_mask=full_mask, position_ids=self._models.positions(full_mask),
                      use_cache=False)
        if self._fused:
            # Position P-1 predicts the first response token. The head's GEMM, the softmax and
            # their backward run in row chunks: no (N, T, V) logits, nor their gradient.
            hidden = (self._prompt_once(ids, attn, responses, mask, group) if shared
                      else self._models.last_hidden(self.policy, **inputs)[:, -t - 1:-1])  # (N, T, H)
            head = self.policy.get_output_embeddings()
            ab = head.factors() if isinstance(head, self._stacked.StackedLoRA) else None
            base = self._models._base_head(self.policy)
            # TRL's cast_lm_head_to_fp32: the head's GEMM in fp32 (an exact upcast; only its rounding changes)
            up = (lambda x: None if x is None else x.float()) if self.cfg.model.cast_lm_head_to_fp32 else (lambda x: x)
            if ab is None:  # one head for every member: one call over all rows
                p = self.layers[0].A.shape[0]
                if not rng.device_paths(hidden.device) and p > 1 and hidden.shape[0] % p == 0:
                    # member by member on a CPU, as stacked.py's base products: the pinned MKL path rounds a GEMM
                    # by its row count, so one call over every member's rows would not be each run's alone
                    return [on_head(up(h), up(base.weight), up(base.bias), r)
                            for h, r in zip(hidden.chunk(p), responses.chunk(p))]
                return on_head(up(hidden), up(base.weight), up(base.bias), responses)
            # an adapter on the head: W x + s B A x is the GEMM of [x, s A x] and [W, B], member by member
            a, b = ab
            p = a.shape[0]
            return [on_head(up(torch.cat([h, head.scale * (h @ a[i].T)], -1)), up(torch.cat([base.weight, b[i]], 1)),
                            up(base.bias), r)
                    for i, (h, r) in enumerate(zip(hidden.chunk(p), responses.chunk(p)))]
        # the materialised reference: the model's own logits, the T that predict response tokens
        if shared:
            return on_logits(self._prompt_once(ids, attn, responses, mask, group))
        return on_logits(self.policy(**inputs, logits_to_keep=t + 1).logits[:, :t])   # (N, T, V)

    def _forward(self, ids: Tensor, attn: Tensor, responses: Tensor, mask: Tensor, with_entropy: bool, group: int):
        """fp32 log p and entropy (N, T) of responses (N, T) after prompts (N, P), under the sampler's
        tempered distribution softmax(fp32(logits) / T)."""
        from ...numerics.logprobs import linear_logprobs, token_logprobs

        tau, backend = self.cfg.sampling.temperature, self.run_cfg.backend

        def on_head(hidden, weight, bias, labels):
            return linear_logprobs(hidden, weight, labels, backend=backend, with_entropy=with_entropy, bias=bias,
                                   temperature=tau)

        def on_logits(logits):
            if tau != 1.0:
                # in fp32, as the sampler divides: bf16 logits / T would round to other log-probs
                logits = logits.float() / tau
            return token_logprobs(logits, responses, backend=backend, with_entropy=with_entropy)

        out = self._through_head(ids, attn, responses, mask, on_head, on_logits, group)
        if isinstance(out, list):
            return torch.cat([o[0] for o in out]), None if out[0][1] is None else torch.cat([o[1] for o in out])
        return out

    def _flat(self, rollout: Rollout) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Prompt ids and mask, responses and their mask of a rollout, one row per response (P B G, ...)."""
        p, b, g, t = rollout.responses.shape
        ids = rollout.extra["prompt_ids"].repeat_interleave(g, 1).view(p * b * g, -1)
        attn = rollout.extra["prompt_mask"].repeat_interleave(g, 1).view(p * b * g, -1)
        return ids, attn, rollout.responses.reshape(-1, t), rollout.mask.reshape(-1, t)

    @torch.no_grad()
    def sum_pi_squared(self, rollout: Rollout) -> Tensor:
        """(P, B, G, T) sum_v pi(v | prefix)^2 of the policy at each response position, under the sampling
        temperature: the fused head's chunks (never the (N, T, V) logits) unless backend is torch."""
        from ...numerics.logprobs import linear_sum_pi_squared, token_sum_pi_squared

        tau, backend = self.cfg.sampling.temperature, self.run_cfg.backend
        self.policy.eval()
        out = self._through_head(*self._flat(rollout),
                                 lambda h, w, bias, _: linear_sum_pi_squared(h, w, backend, bias, tau),
                                 lambda logits: token_sum_pi_squared(logits, backend, tau), rollout.responses.shape[2])
        return (torch.cat(out) if isinstance(out, list) else out).view(rollout.responses.shape)

    def logprobs(self, rollout: Rollout, reference: bool = False) -> tuple[Tensor, Tensor | None]:
        p, b, g, t = rollout.responses.shape
        ids, attn, responses, mask = self._flat(rollout)
        if reference:
            with self._stacked.adapters(self.layers, self._stacked.REFERENCE):
                logp, ent = self._forward(ids, attn, responses, mask, False, g)
        else:
            # train mode only matters for LoRA dropout (base dropout is off); no_grad passes
            # (old log-probs) run in eval mode so they match the sampler
            grad = torch.is_grad_enabled()
            self.policy.train(grad)
            if grad:  # each member's dropout masks from its own stream, pass by pass
                self._passes += 1
                for i, layer in enumerate(self.layers):
                    layer.dropout_gens = [rng.stream(s, "dropout", self._passes, i) for s in self.seeds]
            logp, ent = self._forward(ids, attn, responses, mask, True, g)
            self.policy.eval()
        return logp.view(p, b, g, t), None if ent is None else ent.view(p, b, g, t)
