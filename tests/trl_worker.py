"""One GRPOBenchTrainer run for tests/test_trl_multiprocess.py, in one process or under `accelerate launch`.

    python tests/trl_worker.py OUT.pt [--save-at STEP] [--resume CHECKPOINT]
    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/trl_worker.py OUT.pt [...]

The completions are a fixed function of each completion's place in the global batch and of
the rollout, not sampled, so that one process and two see the same generation batch: TRL's
sampler hands process p the p-th slice of it. TRL's shuffle before splitting into
micro-batches is replaced by a fixed order that gives the micro-batch k of one process the
rows that the micro-batches k of two processes hold together, so that the step filter (a
quantile over the micro-batch of every process) sees the same tokens in both runs.
Process 0 saves the gathered completions and advantages, TRL's log and the trained weights.
"""
import argparse
import faulthandler
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import trl.trainer.grpo_trainer as trl_grpo  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from grpo_bench.integrations.trl import GRPOBenchTrainer  # noqa: E402
from grpo_bench.tasks.lm.models import build_tiny  # noqa: E402
from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer  # noqa: E402

GLOBAL, G, T, ACCUM, PROCS = 16, 4, 6, 2, 2   # completions per optimizer step, group size, max tokens
VARIANT = {"delta": "rloo", "loss": {"name": "clipped", "clip_high": 0.28}, "aggregate": "token_mean",
           "kl": "k1", "kl_coef": 0.05, "kl_placement": "reward", "ref_update": {"name": "hard", "every": 2},
           "filters": ["mask_truncated", {"name": "top_entropy", "rho": 0.5}],
           # registry v3: a positive-example NLL term; off-policy sequence masking of the second pass
           "nll_coef": 0.1, "corrections": [{"name": "opsm", "threshold": 0.002}]}
LORA = dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True, task_type="CAUSAL_LM")


def reward(prompts, completions, **kwargs):
    # distinct values within a group, from the text alone
    return [(sum(map(ord, c)) % 7) / 7 for c in completions]


class Worker(GRPOBenchTrainer):
    rollout = 0
    seen: list

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        n, p = len(prompt_ids), self.accelerator.process_index
        out = []
        for i in range(n):
            g = torch.Generator().manual_seed(1000 * self.rollout + p * n + i)   # the place in the global batch
            length = int(torch.randint(1, T + 1, (1,), generator=g))
            ids = torch.randint(4, self.model.config.vocab_size, (length,), generator=g).tolist()
            if length < T or torch.rand(1, generator=g) < 0.5:    # ended with EOS, or cut off at T
                ids[-1] = self.eos_token_ids[0]
            out.append(ids)
        self.rollout += 1
        return out, None

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        pad = self.accelerator.pad_across_processes
        ids = self.accelerator.gather(pad(out["completion_ids"], dim=1, pad_index=self._tokenizer.pad_token_id))
        self.seen.append({"completion_ids": ids, "advantages": self.accelerator.gather(out["advantages"])})
        return out


def main() -> None:
    a = argparse.ArgumentParser()
    a.add_argument("out")
    a.add_argument("--save-at", type=int, help="a checkpoint at this optimizer step")
    a.add_argument("--resume", help="a checkpoint to resume from")
    args = a.parse_args()
    # a rank that hangs prints every thread's stack and exits before the test's timeout (300 s), so that the
    # failure says where it hung: once in a full suite the two-process run trained, printed its summary and
    # then never exited (it takes about 30 s)
    faulthandler.dump_traceback_later(240, exit=True)
    procs = int(os.environ.get("WORLD_SIZE", "1"))
    assert procs in (1, PROCS)
    tok = build_char_tokenizer()
    # fp64: the policy gradient cancels within each group (the advantages sum to 0), and in fp32 the
    # rounding of two ways of summing leaves ~2e-3 of it, as large as the errors this test looks for
    model = build_tiny(tok, 2, 32, 2, seed=0).double()
    cfg = GRPOConfig(output_dir=str(Path(args.out).parent / "trl"), max_steps=4, num_generations=G,
                     max_completion_length=T, per_device_train_batch_size=GLOBAL // ACCUM // procs,
                     gradient_accumulation_steps=ACCUM, num_iterations=2, learning_rate=20.0, logging_steps=1,
                     report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
                     save_strategy="steps" if args.save_at else "no", save_steps=args.save_at or 500,
                     # SGD: Adam's first step is lr * sign(g), which turns rounding in a g of ~0 into a step of lr;
                     # a large rate so that the second pass over a rollout clips
                     optim="sgd")
    ds = Dataset.from_dict({"prompt": [f"{a}+{b}=" for a in range(8) for b in range(3)]})
    part = GLOBAL // PROCS // ACCUM       # rows of one micro-batch of one of PROCS processes
    # micro-batch k of one process: the rows that micro-batches k of PROCS processes hold together
    one = [q * part * ACCUM + k * part + i for k in range(ACCUM) for q in range(PROCS) for i in range(part)]
    perm = torch.tensor(one) if procs == 1 else torch.arange(GLOBAL // procs)
    shuffle = trl_grpo.shuffle_sequence_dict

    def fixed_order(batch):   # TRL's own shuffle, with this permutation for its random one
        randperm, torch.randperm = torch.randperm, lambda n, *a, **k: perm
        try:
            return shuffle(batch)
        finally:
            torch.randperm = randperm

    trl_grpo.shuffle_sequence_dict = fixed_order
    trainer = Worker(model, reward_funcs=[reward], args=cfg, train_dataset=ds, processing_class=tok,
                     peft_config=LoraConfig(**LORA), variant=VARIANT)
    trainer.seen = []
    trainer.train(resume_from_checkpoint=args.resume)
    if trainer.accelerator.is_main_process:
        weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora" in n}
        backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else None
        torch.save({"procs": trainer.accelerator.num_processes, "backend": backend, "log": trainer.state.log_history,
                    "seen": trainer.seen, "weights": weights}, args.out)
    if torch.distributed.is_initialized():
        # every rank waits for the save, then leaves without running any teardown: a rank that simply exited
        # while the other still held the group aborted it once in CI ("terminate called without an active
        # exception", exit -6, in gloo's threads' destructors), and after destroy_process_group a full suite's
        # run once never exited at all
        torch.distributed.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
