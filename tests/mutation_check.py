"""Mutation check of the attention core: each mutation breaks the code on purpose (a bias sign
flipped, a query offset shifted by one, a causal mask dropped) in a copy of the package, runs the
core tests against the copy, and expects at least one test to fail. A mutation the tests do not
notice ("survived") is a gap in the tests.

    python tests/mutation_check.py              # every mutation, the core tests; exits 1 if any survives
    python tests/mutation_check.py --list       # the mutations
    python tests/mutation_check.py -k offset    # the mutations whose name contains "offset"
    python tests/mutation_check.py -k torchrun  # distributed training and evaluation (2 gloo processes each)
    python tests/mutation_check.py -k tokens    # tokenizers and bits per byte;  -k config: experiment files
    python tests/mutation_check.py -k frontier  # the data-dependent biases (FoX, CoPE, DAPE)
    python tests/mutation_check.py -k forms     # evaluation forms (PI, NTK, YaRN, logn, table forms)
    python tests/mutation_check.py -k finetune  # fine-tuning to the target length (relbench finetune)
    python tests/mutation_check.py -k mqar      # multi-query associative recall (trials, weights, rows)
    python tests/mutation_check.py -k jobs      # training runs side by side (relbench train --jobs)
    python tests/mutation_check.py -k reach     # training to criterion, reach over learned seeds, context use
    python tests/mutation_check.py -k console   # the command line's output in a pipe or a log
    python tests/mutation_check.py -k merge     # folding runs made side by side (relbench merge)
    python tests/mutation_check.py -k BAM       # the Bayesian attention prior (bam)
    python tests/mutation_check.py -k ssmax     # Scalable-Softmax, the training option of every scheme
    python tests/mutation_check.py -k layout    # layouts, windows, sinks, query temperature (positions/spec.py)
    python tests/mutation_check.py -k pope      # polar coordinate position embeddings
    python tests/mutation_check.py -k path      # PaTH attention (Householder transforms);  -k cable: CABLE
    python tests/mutation_check.py -k grape     # GRAPE-A, the key-gated additive bias
    python tests/mutation_check.py -k stick     # stick-breaking attention
    python tests/mutation_check.py -k random    # randomized positions (VARIANT:random_positions=N)
    python tests/mutation_check.py -k HoPE      # HoPE (RoPE with its slow pairs unrotated)
    python tests/mutation_check.py -k drawn     # the drawn evaluation form (randomized positions at test time)
    python tests/mutation_check.py -k decide    # pairwise decisions, Holm, equivalence, tiers; consolidation
    python tests/mutation_check.py -k faults    # the machine's faults (full disk, unwritable, a file as the run)

A mutation counts as killed only when pytest reports failing tests (exit 1); any other exit (a test id
not found, a collection error) is an error of the check itself, and the check fails.

Not collected by pytest (its name does not start with test_); it takes a few minutes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE_TESTS = ["tests/test_attention.py", "tests/test_split.py", "tests/test_positions.py", "tests/test_capabilities.py",
              "tests/test_zoo.py", "tests/test_model.py", "tests/test_faithful.py"]

# (name, file, the exact text, what replaces it[, the tests that must notice]): each text occurs
# exactly once in its file; without tests of its own a mutation is checked by the core tests
DDP = "tests/test_distributed.py::"
DDP_TRAIN = [DDP + "test_two_processes_train_the_weights_of_one"]
TOK, CONFIG = "tests/test_tokenizers.py::", "tests/test_config.py::"
FRONTIER = ["tests/test_frontier.py"]
FORMS = ["tests/test_forms.py"]
FINETUNE = ["tests/test_finetune.py"]
MQAR = ["tests/test_mqar.py"]
REACH = ["tests/test_criterion.py", "tests/test_reach.py", "tests/test_bench.py"]
PLUGINS = ["tests/test_plugins.py", "tests/test_contract.py"]
JOBS = ["tests/test_jobs.py"]
SUMMARIES = ["tests/test_summaries.py"]
FINDINGS = ["tests/test_findings.py"]
MERGE = ["tests/test_merge.py"]
DECIDE = ["tests/test_comparisons.py", "tests/test_decisions.py"]
PANELS = ["tests/test_panels.py"]
FAULTS = ["tests/test_fault_table.py"]
MEMORY_RUNS = ["tests/test_memory.py::test_training_bytes_is_the_peak_resident_set_of_a_real_run"]
INTEGRITY = ["tests/test_integrity.py"]
BAM = ["tests/test_bam.py", "tests/test_capabilities.py"]
SSMAX = ["tests/test_ssmax.py"]
LAYOUTS = ["tests/test_layouts.py"]
FLIPFLOP = ["tests/test_flipflop.py"]
NEEDLES = ["tests/test_needles.py"]
TRACKING = ["tests/test_tracking.py"]
REGISTRY = ["tests/test_task_registry.py"]
STICK = ["tests/test_stickbreaking.py", "tests/test_capabilities.py"]
RANDOM = ["tests/test_random_positions.py"]
DRAWN = ["tests/test_drawn_form.py"]
HOPE = ["tests/test_hope.py"]
PLOTS = ["tests/test_curves.py", "tests/test_report.py"]
DOCS = ["tests/test_docs.py"]
MUTATIONS = [
    ("bias sign flipped on the reference path", "relbench/attention/__init__.py",
     "scores = scores + plan.full().to(scores.dtype)", "scores = scores - plan.full().to(scores.dtype)"),
    ("bias sign flipped in every distance plan", "relbench/positions/plan.py",
     "return toeplitz(self.values, first, q_end - q_start, k_end - k_start)",
     "return -toeplitz(self.values, first, q_end - q_start, k_end - k_start)"),
    ("ALiBi slope sign flipped", "relbench/positions/alibi.py",
     "return -self.slopes.view(", "return self.slopes.view("),
    ("BAM's location shifts the signed offset the wrong way", "relbench/positions/bam.py",
     "(d - self.mu.view(shape))", "(d + self.mu.view(shape))", BAM),
    ("ssmax counts one key too many per row", "relbench/positions/plan.py",
     "torch.arange(q_start + 1, q_end + 1, device=device", "torch.arange(q_start + 2, q_end + 2, device=device", SSMAX),
    ("ssmax leaves the far keys' constant unscaled", "relbench/positions/plan.py",
     "return None if constant is None else constant * self.factor(q_start, q_end)[..., 0]",
     "return None if constant is None else constant", SSMAX),
    ("ssmax scales the bias but not the content", "relbench/model.py",
     "return q * factor[..., None], (RowScaledPlan", "return q, (RowScaledPlan", SSMAX),
    ("ssmax_bias=false scales the bias anyway", "relbench/model.py",
     "(RowScaledPlan(plan, scales) if plan is not None and bias else plan)",
     "(RowScaledPlan(plan, scales) if plan is not None else plan)", SSMAX),
    ("ssmax's score_mod adds the unscaled bias", "relbench/positions/plan.py",
     "return score + factor * (inner(score, b, h, q_idx, kv_idx) - score)", "return inner(score, b, h, q_idx, kv_idx)", SSMAX),
    ("layout: a window hides one key too few", "relbench/attention/__init__.py",
     "(distance < 0) | (distance >= window)", "(distance < 0) | (distance > window)", LAYOUTS),
    ("layout: the band starts one key late", "relbench/attention/__init__.py",
     "first = max(0, offset + start - window + 1)", "first = max(0, offset + start - window + 2)", LAYOUTS),
    ("layout: the reference path forgets the sink", "relbench/attention/__init__.py",
     "weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]",
     "weights = torch.softmax(scores, dim=-1)", LAYOUTS),
    ("layout: the sink's key is not zero", "relbench/attention/__init__.py",
     "t.new_zeros(*t.shape[:-2], 1, t.shape[-1])", "t.new_ones(*t.shape[:-2], 1, t.shape[-1])", LAYOUTS),
    ("layout: Llama 4's temperature without its floor", "relbench/model.py",
     "torch.log(torch.floor((p + 1) / floor) + 1)", "torch.log((p + 1) / floor + 1)", LAYOUTS),
    ("layout: every layer's queries take the temperature", "relbench/model.py",
     'if self.layer.temperature != "none":', "if True:", LAYOUTS),
    ("layout: a per-layer scheme shared by its layers", "relbench/model.py",
     "share = layer.cls.layers_share(options)", "share = True", LAYOUTS),
    ("layout: a registered name after a comma read as an option", "relbench/positions/spec.py",
     'opens = ":" in head or ("=" not in head and head in names())', 'opens = ":" in head', LAYOUTS),
    ("layout: a depth the pattern does not divide is cut short", "relbench/positions/spec.py",
     "if n_layers % len(self.pattern):", "if False:", LAYOUTS),
    ("layout: a form set on the layers it does not apply to", "relbench/positions/forms.py",
     "if form is not None and not form.applies(type(enc)):\n            continue", "pass", LAYOUTS),
    ("layout: the parameter count reads the first layer's block for all", "relbench/cost/memory.py",
     "blocks = sum(p.numel() for layer in layout for p in Block(model, layer).parameters())",
     "blocks = len(layout) * sum(p.numel() for p in Block(model, layout[0]).parameters())", LAYOUTS),
    ("layout: the memory estimate sums its kinds unweighted", "relbench/cost/memory.py",
     "return weights, sum(s * line[1] for s, line in lines), sum(s * line[2] for s, line in lines)",
     "return weights, sum(line[1] for s, line in lines), sum(line[2] for s, line in lines)", LAYOUTS),
    ("layout: a cost row sums its layers instead of their mean", "relbench/cost/profiling.py",
     "row[key] = None if None in values else sum(values) / len(values)", "row[key] = None if None in values else sum(values)",
     LAYOUTS),
    ("layout: partial_rope rotates every channel", "relbench/positions/rope.py",
     "self.rotary_dim = int(head_dim * fraction) // 2 * 2", "self.rotary_dim = head_dim", ["tests/test_partial_rope.py"]),
    ("layout: partial_rope reads the whole head's frequency ladder", "relbench/positions/rope.py",
     "inv_freq = rope_frequencies(self.rotary_dim, self.base, device)",
     "inv_freq = rope_frequencies(self.head_dim, self.base, device)[: self.rotary_dim // 2]", ["tests/test_partial_rope.py"]),
    ("layout: p-RoPE counts the head's channels, not the rotated ones", "relbench/positions/rope_forms.py",
     "kept = int(self.p * enc.rotary_dim // 2)", "kept = int(self.p * enc.head_dim // 2)", ["tests/test_partial_rope.py"]),
    ("pope: the learned phase turns the other way", "relbench/positions/pope.py",
     "polar(k, angle + delta, 1.0)", "polar(k, angle - delta, 1.0)", ["tests/test_pope.py"]),
    ("pope: the logit scaled by the doubled width", "relbench/positions/pope.py",
     "polar(q, q_angle, math.sqrt(2))", "polar(q, q_angle, 1.0)", ["tests/test_pope.py"]),
    ("pope: the magnitude is the raw channel", "relbench/positions/pope.py",
     "magnitude = F.softplus(x.float())", "magnitude = x.float()", ["tests/test_pope.py"]),
    ("pope: RoPE's frequency ladder (one per pair)", "relbench/positions/pope.py",
     "base ** (-torch.arange(head_dim, dtype=torch.float32, device=device) / head_dim)",
     "base ** (-2 * torch.arange(head_dim, dtype=torch.float32, device=device) / head_dim)", ["tests/test_pope.py"]),
    ("pope: the phase unclamped", "relbench/positions/pope.py",
     "delta = self.phase.clamp(-2 * math.pi, 0.0)[:, None, :]", "delta = self.phase[:, None, :]", ["tests/test_pope.py"]),
    ("cable: the bias's sign flipped back to a gain", "relbench/positions/fox.py",
     "return -F.softplus(self.gate(x.to(self.gate.weight.dtype))).transpose(1, 2)",
     "return F.softplus(self.gate(x.to(self.gate.weight.dtype))).transpose(1, 2)", ["tests/test_cable.py"]),
    ("cable: q.k divided by sqrt(d) after all", "relbench/positions/fox.py",
     "return q * self.head_dim ** 0.5, k", "return q, k", ["tests/test_cable.py"]),
    ("path: a query's own token transforms the keys before it (off by one)", "relbench/positions/path.py",
     "a = max(0, j - q_start)", "a = max(0, j + 1 - q_start)", ["tests/test_path.py"]),
    ("path: beta in (0, 1), no reflections", "relbench/positions/path.py",
     "2 * torch.sigmoid(self.bt(x.to(self.bt.weight.dtype)).float())",
     "torch.sigmoid(self.bt(x.to(self.bt.weight.dtype)).float())", ["tests/test_path.py"]),
    ("path: the short convolution sees later tokens", "relbench/positions/path.py",
     "padded = F.pad(x, (size - 1, 0))", "padded = F.pad(x, (0, size - 1))", ["tests/test_path.py"]),
    ("path: w not normalised", "relbench/positions/path.py",
     "w = F.normalize(w.transpose(1, 2).contiguous().view(B, L, self.n_heads, self.head_dim).float(), dim=-1)",
     "w = w.transpose(1, 2).contiguous().view(B, L, self.n_heads, self.head_dim).float()", ["tests/test_path.py"]),
    ("path: the transforms' step taken from the untransformed query", "relbench/positions/path.py",
     "((rows[..., a:, :] + delta) * w).sum(-1, keepdim=True)", "(rows[..., a:, :] * w).sum(-1, keepdim=True)",
     ["tests/test_path.py"]),
    ("grape-a: the penalty grows toward the query", "relbench/positions/grape.py",
     "return -distance * self.omega[:, None, None]", "return distance * self.omega[:, None, None]", ["tests/test_grape.py"]),
    ("grape-a: the rate without the ALiBi slopes", "relbench/positions/grape.py",
     "F.softplus(self.rate) * self.alibi.to(gate.device)", "F.softplus(self.rate)", ["tests/test_grape.py"]),
    ("grape-a: u not normalised", "relbench/positions/grape.py",
     "u = F.normalize(self.u.float(), dim=-1, eps=1e-6)", "u = self.u.float()", ["tests/test_grape.py"]),
    ("grape-a: the gate's logit not scaled by sqrt(d)", "relbench/positions/grape.py",
     "(k.float() * u[:, None, :]).sum(-1) / math.sqrt(self.head_dim)", "(k.float() * u[:, None, :]).sum(-1)",
     ["tests/test_grape.py"]),
    ("grape-a: the rate's softplus dropped", "relbench/positions/grape.py",
     "return KeyGatedPlan(gate, F.softplus(self.rate) *", "return KeyGatedPlan(gate, self.rate *", ["tests/test_grape.py"]),
    ("HoPE keeps the slow pairs rotary and drops the fast", "relbench/positions/rope.py",
     "return torch.where(self.kept(device), inv_freq, torch.zeros_like(inv_freq))",
     "return torch.where(self.kept(device), torch.zeros_like(inv_freq), inv_freq)", HOPE),
    ("HoPE's threshold a radian instead of a full turn", "relbench/positions/rope.py",
     "return inv_freq * self.train_length >= 2 * math.pi * self.cycles", "return inv_freq * self.train_length >= self.cycles",
     HOPE),
    ("randomized positions drawn but not sorted", "relbench/positions/base.py",
     "return torch.randperm(limit, generator=generator)[:length].sort().values",
     "return torch.randperm(limit, generator=generator)[:length]", RANDOM),
    ("randomized positions drawn from one position too few", "relbench/positions/base.py",
     "torch.randperm(limit, generator=generator)", "torch.randperm(limit - 1, generator=generator)", RANDOM),
    ("the drawn form's positions never reach the model", "relbench/model.py",
     "positions = placing.form.placement(placing, tokens)", "positions = None", DRAWN),
    ("the drawn form places every sequence of a batch at the same positions", "relbench/positions/forms.py",
     "self.seed * 1_000_003 + zlib.crc32(row.numpy().tobytes())", "self.seed * 1_000_003", DRAWN),
    ("a model read at drawn positions is skipped by its ordinary-position criterion", "relbench/evaluation/evaluators.py",
     "    if spec and forms.places_positions(spec):\n        return None\n", "", DRAWN),
    ("randomized positions: a relative bias at chosen positions reads j - i", "relbench/positions/base.py",
     "positions[:, k_len - q_len:, None] - positions[:, None, :]", "positions[:, None, :] - positions[:, k_len - q_len:, None]",
     RANDOM),
    ("randomized positions: training leaves the drawn positions out", "relbench/training/train.py",
     "if model.random_positions else None", "if False else None", RANDOM),
    ("randomized positions: rope's queries at chosen positions take the first rows", "relbench/positions/rope.py",
     "cos[..., k_len - q_len:, :], sin[..., k_len - q_len:, :]", "cos[..., :q_len, :], sin[..., :q_len, :]", RANDOM),
    ("randomized positions: FIRE at chosen positions normalises by the key's position", "relbench/positions/fire.py",
     "self.psi(torch.maximum(query, self.threshold())) + EPS)\n            return DensePlan",
     "self.psi(torch.maximum(positions[:, None, :].float(), self.threshold())) + EPS)\n            return DensePlan", RANDOM),
    ("randomized positions: sinusoidal at chosen positions reads the first rows", "relbench/positions/absolute.py",
     "return table[positions] * self.scale", "return table[: positions.shape[-1]] * self.scale", RANDOM),
    ("stick-breaking's product includes the key it serves", "relbench/positions/stickbreaking.py",
     "after = torch.cat([from_key[..., 1:], torch.zeros_like(from_key[..., :1])], dim=-1)", "after = from_key", STICK),
    ("stick-breaking drops the rest of the stick", "relbench/positions/stickbreaking.py",
     "outputs.append(out + remainder[..., None].to(v.dtype) * v[..., offset + start: offset + end, :])",
     "outputs.append(out)", STICK),
    ("stick-breaking lets a query take its own key by default", "relbench/positions/stickbreaking.py",
     "allowed = keys <= rows if attend_current else keys < rows", "allowed = keys <= rows", STICK),
    ("stick-breaking's rows start at key 0, not at the query's position", "relbench/positions/stickbreaking.py",
     "stick_breaking_weights(q[..., start:end, :], k[..., :keys, :], offset + start,",
     "stick_breaking_weights(q[..., start:end, :], k[..., :keys, :], start,", STICK),
    ("BAM's eps dropped", "relbench/positions/bam.py",
     ".abs() + self.eps", ".abs()", BAM),
    ("BAM's scale read as the scale, not its log", "relbench/positions/bam.py",
     "return -self.theta_alpha.view(shape).exp() *", "return -self.theta_alpha.view(shape) *", BAM),
    ("sign of the far keys' constant flipped on the split path", "relbench/attention/fused.py",
     "far_lse = far_lse + plan.tail(horizon, n)", "far_lse = far_lse - plan.tail(horizon, n)"),
    ("query offset +1 on the chunked path", "relbench/attention/__init__.py",
     "    offset = k_len - q_len\n    outputs = []", "    offset = k_len - q_len + 1\n    outputs = []"),
    ("query offset +1 in the distance plan", "relbench/positions/plan.py",
     "self.first_distance = 1 - q_len", "self.first_distance = 2 - q_len"),
    ("query offset +1 in the causal mask", "relbench/positions/plan.py",
     "return distance_grid(k_len - q_len, k_len, 0, k_len, device) < 0",
     "return distance_grid(k_len - q_len + 1, k_len, 0, k_len, device) < 0"),
    ("query offset +1 in Shaw's plan", "relbench/positions/shaw.py",
     "self.offset = k_len - q_len                       # position of query row 0",
     "self.offset = k_len - q_len + 1"),
    ("query offset +1 in RoPE's query rotation", "relbench/positions/rope.py",
     "q_rot = apply_rotary(q, cos[..., k_len - q_len:, :], sin[..., k_len - q_len:, :])",
     "q_rot = apply_rotary(q, cos[..., k_len - q_len:, :].roll(1, -2), sin[..., k_len - q_len:, :].roll(1, -2))"),
    ("causal mask dropped on the reference path", "relbench/attention/__init__.py",
     'scores = scores.masked_fill(hidden_keys(k_len - q_len, k_len, 0, k_len, window, q.device, chunk), float("-inf"))',
     "scores = scores"),
    ("causal mask dropped on the chunked path", "relbench/positions/plan.py",
     'return bias.masked_fill(distance_grid(q_start, q_end, 0, k_end, bias.device) < 0, float("-inf"))',
     "return bias"),
    ("causal mask dropped in transformer-xl's relative shift", "relbench/positions/transformer_xl.py",
     'padded[..., q_end:] = float("-inf")', "pass"),
    ("causal mask dropped for the split path's far keys", "relbench/attention/fused.py",
     "v[..., : n - horizon, :], causal=True)", "v[..., : n - horizon, :], causal=False)"),
    ("causal mask dropped in the split path's near band", "relbench/attention/fused.py",
     "return four_d(bias.masked_fill((distance < 0) | (distance >= horizon)",
     "return four_d(bias.masked_fill((distance >= horizon)"),
    ("relative shift of the split path's batched band off by one row step", "relbench/attention/fused.py",
     "(s[0], block * s[2], s[1], s[2] - 1, 1)", "(s[0], block * s[2], s[1], s[2], 1)"),
    ("the split path's batched key windows one key late", "relbench/attention/fused.py",
     "_windows(k[b], head - horizon + 1, count, block, width)", "_windows(k[b], head - horizon + 2, count, block, width)"),
    ("FoX's per-key terms with the sign flipped (split-linear)", "relbench/positions/fox.py",
     "return -anchored_log_forget(self.log_f, anchor, 0, k_end)", "return anchored_log_forget(self.log_f, anchor, 0, k_end)"),
    ("FoX's per-key terms anchored one key late (split-linear)", "relbench/positions/fox.py",
     "return -anchored_log_forget(self.log_f, anchor, 0, k_end)",
     "return -anchored_log_forget(self.log_f, min(anchor + 1, k_end - 1), 0, k_end)"),
    ("split-linear's far keys read the block's own key terms", "relbench/attention/fused.py",
     "terms[..., None, :start])", "terms[..., None, 1:start + 1])"),
    ("Shaw's band read one column off", "relbench/positions/shaw.py",
     "first = self.k - horizon + 1", "first = self.k - horizon"),
    ("the log-sum-exp merge weights swapped", "relbench/attention/fused.py",
     "weight = torch.sigmoid(lse_a - lse_b)[..., None]", "weight = torch.sigmoid(lse_b - lse_a)[..., None]"),
    ("causal mask dropped in the linear split's blocks (ALiBi, FoX)", "relbench/attention/fused.py",
     "future = causal_mask(block, block, q.device)", "future = torch.zeros(block, block, dtype=torch.bool)"),
    ("causal mask dropped on the toeplitz path", "relbench/attention/fused.py",
     'w[:, : q_len - 1] = float("-inf")', "pass"),
    ("query offset +1 on the toeplitz path", "relbench/attention/fused.py",
     "mask = w[:, start + first:].as_strided(", "mask = w[:, start + first + 1:].as_strided("),
    ("query offset +1 in transformer-xl's relative shift", "relbench/positions/transformer_xl.py",
     "padded.storage_offset() + q_end - 1 - q_start)", "padded.storage_offset() + q_end - q_start)"),
    ("FIRE's ramp bounds moved 8 keys inward", "relbench/positions/fire.py",
     "lo = (bound[:, a0:a1].amin(1).floor() - 2)", "lo = (bound[:, a0:a1].amin(1).floor() + 8)"),
    ("FIRE's ramps dropped inside their bounds", "relbench/positions/fire.py",
     "target.addcmul_(gains[k], (tile - threshold).clamp_min_(0))", "pass"),
    ("causal mask dropped in FIRE's key segments", "relbench/positions/fire.py",
     'out[:, a0:a1, q_start + a0: keys].masked_fill_(future, float("-inf"))', "pass"),
    ("3-d masks handed to the fused kernel on the chunked path", "relbench/attention/__init__.py",
     "mask = four_d(plan.causal_block(offset + start, offset + end, keys).to(q.dtype))",
     "mask = plan.causal_block(offset + start, offset + end, keys).to(q.dtype)"),
    ("is_causal dropped without a bias", "relbench/attention/__init__.py",
     "        return F.scaled_dot_product_attention(q, k, v, is_causal=True)\n    bias =",
     "        return F.scaled_dot_product_attention(q, k, v)\n    bias ="),
    ("torchrun: every rank trains on the whole batch (its share dropped, the x world scaling kept)",
     "relbench/training/step.py", "inputs, targets = distributed.share(x).to(device), distributed.share(y).to(device)",
     "inputs, targets = x.to(device), y.to(device)", DDP_TRAIN),
    ("torchrun: gradients not scaled by the world size (DDP's average halves them)", "relbench/training/step.py",
     "(part * distributed.world()).backward()", "part.backward()", DDP_TRAIN),
    ("torchrun: each rank divides its loss by its own rows' count", "relbench/training/step.py",
     "distributed.share(weights), loss_denominator(y, weights))",
     "distributed.share(weights), loss_denominator(targets, distributed.share(weights)))", DDP_TRAIN),
    ("torchrun: a rank's loss is its own rows' weighted mean", "relbench/training/step.py",
     'return _divide(weighted_loss(logits, targets, weights, reduction="sum"), denominator)',
     "return weighted_loss(logits, targets, weights)",
     [DDP + "test_weighted_loss_split_over_ranks_is_the_unsplit_loss_and_gradient"]),
    ("torchrun: validation loss of rank 0's rows only", "relbench/training/step.py",
     "total, count = distributed.sum_all(torch.tensor([total, count], dtype=torch.float64, device=device)).tolist()",
     "pass", DDP_TRAIN),
    ("torchrun: a signal stops only the rank that got it", "relbench/training/train.py",
     "signum = distributed.max_all(stop.signum or 0, device) if stop is not None else 0",
     "signum = (stop.signum or 0) if stop is not None else 0",
     [DDP + "test_interrupted_run_resumes_to_the_weights_of_an_uninterrupted_one"]),
    ("torchrun: rank 0 merges only its own extrapolation rows", "relbench/evaluation/extrapolate.py",
     "for rank_updates, rank_lines, _ in gathered:", "for rank_updates, rank_lines, _ in gathered[:1]:",
     [DDP + "test_extrapolate_under_two_processes_writes_the_rows_of_one"]),
    ("tokens: a BPE token counted as one byte", "relbench/data/tokenizer.py",
     "self.token_bytes = np.array([len(p) for p in self.pieces], dtype=np.int64)",
     "self.token_bytes = np.ones(len(self.pieces), dtype=np.int64)",
     [TOK + "test_bits_per_byte_of_bpe_matches_a_hand_computation"]),
    ("tokens: bits per byte as the loss / ln 2 for every tokenizer", "relbench/evaluation/perplexity.py",
     "bits_per_byte = loss * (text.n_tokens / n_bytes) / math.log(2)", "bits_per_byte = loss / math.log(2)",
     [TOK + "test_bits_per_byte_of_bpe_matches_a_hand_computation"]),
    ("tokens: bytes of the window's inputs, not its targets", "relbench/evaluation/perplexity.py",
     "text.token_bytes[rows[:, score_from + 1:]]", "text.token_bytes[rows[:, score_from:-1]]",
     [TOK + "test_bits_per_byte_of_bpe_matches_a_hand_computation"]),
    ("tokens: BPE learned from every document, test text included", "relbench/data/__init__.py",
     '        if split_of(index) == "train":\n            yield text', '        if True:\n            yield text',
     [TOK + "test_bpe_is_trained_on_the_train_split_only"]),
    ("tokens: --max-train-tokens not applied", "relbench/data/__init__.py",
     '        arrays["train"] = arrays["train"][:max_train_tokens]', "        pass",
     [TOK + "test_max_train_tokens_without_a_stream_cuts_the_train_split_only"]),
    ("tokens: the model's vocabulary not the tokenizer's", "relbench/cli/pipeline.py",
     "    exp.model.vocab_size = splits.tokenizer.vocab_size", "    pass",
     [TOK + "test_tiny_bpe_run_trains_extrapolates_and_reports"]),
    ("tokens: a checkpoint's tokenizer not checked", "relbench/cli/pipeline.py",
     "        checkpoints.check_tokenizer(rundir.checkpoint_dir(run_dir, forms.trained_spec(spec), seed), splits.tokenizer)",
     "        pass",
     [TOK + "test_tiny_bpe_run_trains_extrapolates_and_reports"]),
    ("tokens: extrapolate reads a run's data as bytes", "relbench/data/__init__.py",
     'else data.dataset, data.tokenizer, stream=data.stream,', 'else data.dataset, "bytes", stream=data.stream,',
     [TOK + "test_tiny_bpe_run_trains_extrapolates_and_reports"]),
    ("frontier: FoX's bias sign flipped", "relbench/positions/fox.py",
     "return rows[..., :, None] - keys[..., None, :]", "return keys[..., None, :] - rows[..., :, None]", FRONTIER),
    ("frontier: FoX sums the gates over [j, i) instead of (j, i]", "relbench/positions/fox.py",
     "after = log_f[..., anchor + 1: hi].cumsum(-1)", "after = log_f[..., anchor: hi - 1].cumsum(-1)", FRONTIER),
    ("frontier: FoX's causal mask dropped on the chunked path", "relbench/positions/fox.py",
     'return bias.masked_fill_(distance_grid(q_start, q_end, 0, k_end, bias.device) < 0, float("-inf"))',
     "return bias", FRONTIER),
    ("frontier: CoPE counts gates forward from the first key", "relbench/positions/cope.py",
     "return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=p_max - 1)", "return gates.cumsum(-1).clamp(max=p_max - 1)",
     FRONTIER),
    ("frontier: CoPE counts the gates of future keys", "relbench/positions/cope.py",
     'gates = torch.sigmoid(logits.masked_fill(future, float("-inf")))', "gates = torch.sigmoid(logits)", FRONTIER),
    ("frontier: DAPE's MLP does not see the logits", "relbench/positions/dape.py",
     "features = torch.cat([logits, base], dim=1)", "features = torch.cat([torch.zeros_like(logits), base], dim=1)",
     FRONTIER),
    ("config: a run's data left out of the same-run check", "relbench/runs/runconfig.py",
     '+ [key for key, value in new["data"].items() if old_data.get(key) != value])', "+ [])",
     [TOK + "test_tiny_bpe_run_trains_extrapolates_and_reports"]),
    ("config: config.toml without its [train] table", "relbench/runs/runconfig.py",
     'for k in ("variants", "seeds", "data", "model", "train", "eval")}',
     'for k in ("variants", "seeds", "data", "model", "eval")}',
     [CONFIG + "test_config_toml_reproduces_the_run"]),
    ("forms: PI divides the frequencies by factor + 1", "relbench/positions/rope_forms.py",
     "return inv_freq / self.scale(enc, length)", "return inv_freq / (self.scale(enc, length) + 1)", FORMS),
    ("forms: YaRN's attention temperature dropped", "relbench/positions/rope_forms.py",
     "return yarn_attention_factor(self.scale(enc, length)) ** 2", "return 1.0", FORMS),
    ("forms: YaRN's ramp the wrong way round (low frequencies kept, high ones interpolated)",
     "relbench/positions/rope_forms.py", "return ((1 - gamma) * theta / s + gamma * theta).to(inv_freq.dtype)",
     "return (gamma * theta / s + (1 - gamma) * theta).to(inv_freq.dtype)", FORMS),
    ("forms: logn also at and below the training length", "relbench/positions/forms.py",
     "return math.log(length) / math.log(train_length) if length > train_length > 1 else 1.0",
     "return math.log(length) / math.log(train_length)", FORMS),
    ("forms: logn scales q.k but not the bias", "relbench/positions/base.py",
     "plan = None if plan is None else plan.scaled(scale)", "pass", FORMS),
    ("forms: a scaled plan's far-key constant left unscaled (split path)", "relbench/positions/plan.py",
     "return None if tail is None else tail * self.factor", "return tail", FORMS),
    ("forms: extend continues from the row before the last trained one", "relbench/positions/table_forms.py",
     "edge = enc.table[e + enc.k]", "edge = enc.table[e + enc.k - 1]", FORMS),
    ("finetune: batches at the training length, not --length", "relbench/training/train.py",
     "(start.length, start.data_offset) if start is not None",
     "(model_config.train_length, start.data_offset) if start is not None",
     FINETUNE),
    ("finetune: the data order restarts at step 0 instead of continuing training's", "relbench/training/train.py",
     "training_batch(loop.train_tokens, loop.data_offset + step, config", "training_batch(loop.train_tokens, step, config",
     FINETUNE),
    ("finetune: starts from the seed's initialisation, not the checkpoint", "relbench/training/train.py",
     "        model.load_state_dict(start.weights)", "        pass", FINETUNE),
    ("finetune: --lr ignored (the training peak always)", "relbench/training/finetune.py",
     "lr=lr or train.lr,", "lr=train.lr,", FINETUNE),
    ("finetune: writes over the original checkpoint", "relbench/training/finetune.py",
     "label, folder = f\"{entry} seed {seed}\", rundir.checkpoint_dir(run_dir, entry, seed)",
     "label, folder = f\"{entry} seed {seed}\", rundir.checkpoint_dir(run_dir, spec, seed)", FINETUNE),
    ("finetune: a form named on finetune is not applied while fine-tuning", "relbench/training/train.py",
     "            forms.apply(model, start.form)", "            pass", FINETUNE),
    ("finetune: a form's factor not pinned at the fine-tuning length (dynamic)", "relbench/positions/rope_forms.py",
     "return self if self.factor else replaced(self, factor=self.scale(enc, length))", "return self", FINETUNE),
    ("finetune: a checkpoint fine-tuned under a form evaluated without it", "relbench/evaluation/extrapolate.py",
     "forms.apply(model, unit.spec)", "forms.apply(model, forms.scheme_spec(unit.spec) + "
     "(f'@{forms.split_spec(unit.spec)[1]}' if forms.split_spec(unit.spec)[1] else ''))", FINETUNE),
    ("finetune: the control (--length = the training length) refused", "relbench/training/finetune.py",
     "    if length < model.train_length:", "    if length <= model.train_length:", FINETUNE),
    ("config: the file's values under the options, not over them", "relbench/config.py",
     "cls(**{**tables.get(section, {}), **given})", "cls(**{**given, **tables.get(section, {})})",
     [CONFIG + "test_file_over_preset_and_options_over_file"]),
    ("mqar: keys not distinct (drawn with replacement)", "relbench/tasks/mqar.py",
     "chosen = rng.choice(len(keys), n_pairs, replace=False)", "chosen = rng.choice(len(keys), n_pairs, replace=True)",
     MQAR),
    ("mqar: answer targets one position early (at the value before the query key)", "relbench/tasks/mqar.py",
     "return tokens, asked, asked - (start + 2 * order)", "return tokens, asked - 1, asked - (start + 2 * order)", MQAR),
    ("mqar: filler not cleaned of the task's tokens", "relbench/tasks/mqar.py",
     "filler = clean(filler, tokenizer.vocab_size, filler_token(tokenizer))", "filler = filler.astype(np.int64)", MQAR),
    ("mqar: distance to the pair at the query's index, not to the queried pair", "relbench/tasks/mqar.py",
     "asked - (start + 2 * order)", "asked - (start + 2 * np.arange(n))", MQAR),
    ("mqar: the queried values left as inputs (teacher forcing: later queries see which were asked)",
     "relbench/tasks/mqar.py", "inside = after < out.shape[-1]", "inside = after < 0", MQAR),
    ("mqar: the model scored on inputs that show the answers", "relbench/tasks/mqar.py",
     "inputs = torch.from_numpy(model_inputs(tokens, asked, filler_token(tokenizer))).to(device)",
     "inputs = torch.from_numpy(tokens[:, :-1]).to(device)", MQAR),
    ("mqar: query keys weighted as text in training", "relbench/tasks/mqar.py",
     "w[row, query - 1::2] = 0.0", "pass", MQAR),
    ("mqar: the pair block weighted as text in training", "relbench/tasks/mqar.py",
     "w[row, max(0, start - 1): start - 1 + 2 * n] = 0.0", "pass", MQAR),
    ("mqar: retrieval_accuracy leaves the model in eval mode", "relbench/training/batches.py",
     "model.train(was_training)", "pass", MQAR),
    ("mqar: extrapolate ignores the run's mqar_pairs", "relbench/cli/pipeline.py",
     'train=dict(config.get("train", {})),', "train={},", MQAR),
    ("mqar: passkey rows' Wilson interval over one trial too many", "relbench/tasks/base.py",
     "low, high = wilson(correct, len(answers))", "low, high = wilson(correct, len(answers) + 1)", MQAR),
    ("reach: criterion met by one check instead of consecutive ones", "relbench/training/stopping.py",
     "held = checks[-consecutive:]", "held = checks[-1:]", REACH),
    ("reach: criterion step is the confirming check, not the first held one", "relbench/training/stopping.py",
     "return int(held[0][0]) if all", "return int(held[-1][0]) if all", REACH),
    ("reach: criterion stopping never stops training", "relbench/training/train.py",
     "last = done == state.consolidate_from + config.consolidate_steps",
     "last = done == config.steps + config.consolidate_steps", REACH),
    ("reach: seeds that did not learn count towards reach", "relbench/evaluation/reach.py",
     "return [s for s in self.seeds if self.learned[s].learned]", "return list(self.seeds)", REACH),
    ("reach: a variant with no learned seed shown as reach none", "relbench/evaluation/reach.py",
     'return f"not learned ({k}/{n})"', 'return "none"', REACH),
    ("reach: a not-learned seed without rows is left out of the variant's seeds", "relbench/evaluation/reach.py",
     "seeds = sorted({int(s) for s in mine[\"seed\"].unique()} | unevaluated)",
     "seeds = sorted({int(s) for s in mine[\"seed\"].unique()})", REACH),
    ("reach: a model that did not learn its task is evaluated on it anyway", "relbench/evaluation/evaluators.py",
     'if train.get("task") != task or not train.get("criterion_accuracy") or summary.get("learned") is not False:',
     'if True:', REACH),
    ("reach: a single learned seed's interval drops its upper bound", "relbench/evaluation/reach.py",
     "= (float(r.low), float(r.high))", "= (float(r.low), float(r.low))", REACH),
    ("reach: Wilson interval without the continuity of its centre", "relbench/stats.py",
     "centre = (p + z * z / (2 * trials)) / denominator", "centre = p", REACH),
    ("reach: a copy ratio whose interval reaches 1.00 counts as use of context", "relbench/reporting/overview.py",
     "if high < 1.0 and s.mean <= 1 - USE_MARGIN:", "if s.mean <= 1 - USE_MARGIN:", REACH),
    ("check: a scheme that leaks the future passes causality", "relbench/contract/properties.py",
     "    ok = leak <= CAUSAL_TOLERANCE", "    ok = True", PLUGINS),
    ("check: absolute positions pass translation invariance", "relbench/contract/properties.py",
     "    ok = gap <= 1e-4", "    ok = True", PLUGINS),
    ("check: a declared capability is read from the measurement", "relbench/contract/properties.py",
     "    declared = bool(getattr(positions.scheme(spec), capability))",
     "    declared = measure(spec)[0][capability]", PLUGINS),
    ("plugins: a file changed since training is used without a word", "relbench/positions/plugins.py",
     'if now != record["sha256"] and not accept_change:', "if False:", PLUGINS),
    ("plugins: a class that is not a PositionEncoding is registered", "relbench/positions/registry.py",
     "if self.base is not None and not (isinstance(cls, type) and issubclass(cls, self.base)):", "if False:", PLUGINS),
    ("tasks: the adjacent copy (inputs of no evaluated length) is never evaluated", "relbench/evaluation/evaluators.py",
     "if n == length or (index == 0 and n not in job.lengths)]", "if n == length]", ["tests/test_cli.py"]),
    ("copy: the control keeps the original text where the copy goes", "relbench/tasks/copying.py",
     "control[LEAD: LEAD + SEGMENT] = stream[other: other + SEGMENT]", "pass", ["tests/test_tasks.py"]),
    ("plots: loss by position keeps only the bin with the most tokens", "relbench/reporting/plots.py",
     '''    if "segment" in here:   # one protocol''',
     '''    here = here[here["n_tokens"] == here["n_tokens"].max()]
    if "segment" in here:   # one protocol''', ["tests/test_report.py"]),
    ("memory: the estimate's probe keeps its saved tensors with their graph (never freed)", "relbench/cost/memory.py",
     "        return tensor.detach()", "        return tensor", ["tests/test_memory.py"]),
    ("memory: AdamW's state and the gradients left out of the estimate (the weights alone)", "relbench/cost/memory.py",
     "    weights = FLOAT * 4 * parameter_count(model)", "    weights = FLOAT * parameter_count(model)", MEMORY_RUNS),
    ("memory: the blocks glibc's heap keeps left out of the estimate", "relbench/cost/resident.py",
     "    return int(step + RUNTIME + activations + HEAP_KEPT * gradient_heap_bytes(model))",
     "    return int(step + RUNTIME)", MEMORY_RUNS),
    ("memory: the process's libraries and corpus left out of the estimate", "relbench/cost/resident.py",
     "RUNTIME = 200 * 2**20", "RUNTIME = 0", MEMORY_RUNS),
    ("memory: the heap said to keep blocks above glibc's mmap ceiling", "relbench/cost/resident.py",
     "    below = [per_row for per_row, shared in roles if batch * per_row + shared < MMAP_CEILING]",
     "    below = [per_row for per_row, shared in roles]",
     ["tests/test_memory.py::test_the_heap_keeps_only_what_lies_below_glibcs_mmap_ceiling"]),
    ("memory: the weights a linear layer saves transposed counted as saved tensors", "relbench/cost/memory.py",
     "        if storage.data_ptr() not in weights:", "        if not (tensor.requires_grad and tensor.grad_fn is None):",
     ["tests/test_memory.py::test_the_probe_leaves_out_the_weights_a_linear_layer_saves_transposed"]),
    ("memory: the composed estimate counts the first layer twice", "relbench/cost/memory.py",
     "a + (model.n_layers - 1) * (b - a) + v", "a + model.n_layers * (b - a) + v",
     ["tests/test_memory.py::test_the_saved_line_composed_from_one_and_two_layers_is_the_deep_models_own"]),
    ("dry run: the composed step counts the first layer twice", "relbench/cli/dryrun.py",
     "a + (layers - 1) * max(0.0, b - a) + v", "a + layers * max(0.0, b - a) + v",
     [CONFIG + "test_the_dry_run_composes_a_step_from_one_and_two_layers_the_vocabulary_and_the_batch"]),
    ("dry run: the vocabulary's fixed cost per step counted per token",
     "relbench/cli/dryrun.py", "    return fixed, per_token\n", "    return 0.0, per_token + fixed / length\n",
     [CONFIG + "test_the_dry_run_composes_a_step_from_one_and_two_layers_the_vocabulary_and_the_batch"]),
    ("dry run: a step's fixed cost (optimiser, per-weight work) scaled with the batch", "relbench/cli/dryrun.py",
     "fixed + per_token * length * config.batch_size", "(fixed + per_token * length) * config.batch_size",
     [CONFIG + "test_the_dry_run_composes_a_step_from_one_and_two_layers_the_vocabulary_and_the_batch"]),
    ("jobs: the parent never passes a signal on to its side-by-side runs", "relbench/training/jobs.py",
     "            _signal(process, signal.SIGTERM)\n        try:", "            pass\n        try:", JOBS),
    ("jobs: a child that died is not reported", "relbench/training/jobs.py",
     "                errors.append((\"error\", what))", "                pass", JOBS),
    ("jobs: every side-by-side run trains seed 0", "relbench/training/jobs.py",
     "outcome = trainer(pair, model_config,",
     "import dataclasses; outcome = trainer(dataclasses.replace(pair, config=dataclasses.replace(pair.config, seed=0)), "
     "model_config,",
     JOBS),
    ("summaries: a run without its checkpoint has no summary (train.csv not read)", "relbench/evaluation/summaries.py",
     "    return summary_from_rows(spec, seed, mine, config)", "    return None", SUMMARIES),
    ("summaries: the learned step read as the last check, not the first that held", "relbench/evaluation/summaries.py",
     '"learned_step": learned,', '"learned_step": steps if learned else None,', SUMMARIES),
    ("schedule: decay_steps ignored (the cosine starts after warm-up)", "relbench/training/step.py",
     "start = config.steps - config.decay_steps if config.decay_steps else config.warmup_steps",
     "start = config.warmup_steps", ["tests/test_criterion.py"]),
    ("config: a recorded run lacking a newer key no longer matches its default", "relbench/runs/runconfig.py",
     "    return {**{k: defaults[k] for k in new if k not in old and k in defaults}, **old}", "    return old",
     [CONFIG + "test_a_run_recorded_before_a_key_existed_matches_that_key_at_its_default"]),
    ("dry run: --jobs left out of the projection", "relbench/cli/pipeline.py",
     "    side_by_side = min(resolve_jobs(jobs, specs, exp.model, exp.train, target), len(specs) * len(seeds))",
     "    side_by_side = 1", [CONFIG + "test_the_dry_run_projects_runs_side_by_side_at_their_share_of_the_threads"]),
    ("console: a Ctrl-C while the libraries load left to Python (a traceback, killed by SIGINT)", "relbench/__main__.py",
     "        signal.signal(signal.SIGINT, interrupted_while_loading)\n", "        pass\n",
     ["tests/test_faults.py::test_ctrl_c_while_the_libraries_load_ends_in_one_line_and_130",
      "tests/test_fault_table.py::test_ctrl_c_at_any_moment_of_start_up_ends_in_one_line_and_130"]),
    ("console: a Ctrl-C while the libraries load raised inside them (a library that swallows it loses it)",
     "relbench/__main__.py", "    os._exit(130)", "    raise KeyboardInterrupt",
     ["tests/test_fault_table.py::test_ctrl_c_in_a_library_that_swallows_it_while_loading_still_ends_in_one_line_and_130"]),
    ("console: a pipe gets Rich's 80 columns (the headline table's rows wrap)", "relbench/cli/common.py",
     "else Console(file=file, width=PIPE_WIDTH)", "else Console(file=file)",
     ["tests/test_cli.py::test_a_piped_console_keeps_a_wide_table_row_on_one_line"]),
    ("merge: a row both runs hold, differing, taken for the same", "relbench/runs/merge.py",
     "        elif not _same(mine[label], rows):", "        elif not _same(mine[label], mine[label]):", MERGE),
    ("merge: the folded runs' checkpoints not copied", "relbench/runs/merge.py",
     "    for checkpoint, there in copies:", "    for checkpoint, there in copies[:0]:", MERGE),
    ("merge: a table's key groups ignored (every row of a source appended)", "relbench/runs/merge.py",
     "    if frame.empty or not all(k in frame.columns for k in key):", "    if True:", MERGE),
    ("merge: a source's configured seeds recorded, not the ones it holds", "relbench/runs/merge.py",
     "    names, numbers = set(curves[\"variant\"].astype(str)), {int(s) for s in curves[\"seed\"]}",
     "    names, numbers = set(config.get(\"variants\", [])), set(config.get(\"seeds\", []))", MERGE),
    ("decide: Holm is Bonferroni (every p-value against alpha / m)", "relbench/comparisons.py",
     "stopped = stopped or p_values[key] > alpha / (m - i)", "stopped = stopped or p_values[key] > alpha / m", DECIDE),
    ("decide: Holm goes on after its first failure", "relbench/comparisons.py",
     "rejected[key] = not stopped", "rejected[key] = p_values[key] <= alpha / (m - i)", DECIDE),
    ("decide: equivalence checks only the upper end of the interval", "relbench/comparisons.py",
     "elif -margin <= test.low and test.high <= margin:", "elif test.high <= margin:", DECIDE),
    ("decide: Student's t CDF mirrored", "relbench/comparisons.py",
     "return 1 - tail if t > 0 else tail", "return tail if t > 0 else 1 - tail", DECIDE),
    ("decide: the trials' noise does not bound the spread of the differences", "relbench/comparisons.py",
     "std = max(summary.std, floor)", "std = summary.std", DECIDE),
    ("decide: letters never split a group (different schemes share a letter)", "relbench/comparisons.py",
     "split += [group - {i}, group - {j}]", "split += [group]", DECIDE),
    ("decide: seeds to separate from a one-sided quantile", "relbench/comparisons.py",
     "return effect * math.sqrt(n) >= t_quantile(1 - alpha / 2, n - 1)",
     "return effect * math.sqrt(n) >= t_quantile(1 - alpha, n - 1)", DECIDE),
    ("decide: seeds that did not learn are compared", "relbench/evaluation/decisions.py",
     "found = {s: m for s in r.learned_seeds if (m := measured(r, s, length)) is not None}",
     "found = {s: m for s in r.seeds if (m := measured(r, s, length)) is not None}", DECIDE),
    ("decide: the summary number averages the training length in", "relbench/evaluation/decisions.py",
     "                   if n > train_length})", "                   if n >= train_length})", DECIDE),
    ("decide: consolidation stops at the criterion", "relbench/training/train.py",
     "last = done == state.consolidate_from + config.consolidate_steps", "last = True", REACH),
    ("decide: consolidation's decay starts from the peak, not the rate at the criterion", "relbench/training/step.py",
     "floor = min(start, config.lr * config.consolidate_lr_ratio)", "floor = config.lr * config.consolidate_lr_ratio",
     REACH),
    ("decide: a curve's learned step is its last window's (a consolidated run's dip reads not learned)",
     "relbench/evaluation/summaries.py", "for k in range(1, len(checks) + 1)", "for k in [len(checks)]", REACH),
    ("decide: a panel's evaluation protocol (trials, lengths) is not compared", "relbench/runs/panels.py",
     'for section, keys in (("eval", EVAL_KEYS), ("data", DATA_KEYS)):', 'for section, keys in (("data", DATA_KEYS),):',
     PANELS),
    ("decide: a run against a panel trains its own seeds, not the panel's", "relbench/cli/bench.py",
     "seeds = panels.trained_seeds(panel)", "seeds = [0]", PANELS),
    ("decide: a run against a panel trains every seed the panel has, past the budget", "relbench/runs/panels.py",
     'return list(panel["seeds"])[:AGAINST_SEEDS]', 'return list(panel["seeds"])', PANELS),
    ("decide: a run against a panel loses what it was made from", "relbench/runs/runconfig.py",
     'for kept in ("finetune", "merged_from", "against"):', 'for kept in ("finetune", "merged_from"):', PANELS),
    ("faults: an error of the disk or the file system ends in a traceback", "relbench/cli/group.py",
     "        except OSError as error:", "        except ZeroDivisionError as error:", FAULTS),
    ("faults: a file named as the run directory is taken for one", "relbench/runs/rundir.py",
     "    if Path(run_dir).exists() and not Path(run_dir).is_dir():", "    if False:", FAULTS),
    ("faults: a damaged checksum record is rebuilt from the files", "relbench/runs/results.py",
     "        sums, why = None, type(error).__name__", "        return {}", INTEGRITY),
    ("faults: a CSV with no recorded checksum is read", "relbench/runs/results.py",
     "    if known is None:\n        where", "    if False:\n        where", INTEGRITY),
    ("faults: merge copies a truncated checkpoint", "relbench/runs/merge.py",
     "            problem = checkpoints.damage(checkpoint)", "            problem = None", INTEGRITY),
    ("faults: a run without config.json is adopted", "relbench/runs/runconfig.py",
     "    if not path.is_file() and ((Path(run_dir) / \"checkpoints\").is_dir()",
     "    if False and ((Path(run_dir) / \"checkpoints\").is_dir()", INTEGRITY),
    ("faults: verify --repair records a damaged CSV", "relbench/runs/integrity.py",
     "    added = [f.path for f in findings if f.status == WHOLE]",
     "    added = [f.path for f in findings if f.status != VERIFIED]", INTEGRITY),
    ("faults: workers of --jobs train on after their parent is killed", "relbench/training/jobs.py",
     '    threading.Thread(target=watch, name="relbench-parent-watch", daemon=True).start()', "    pass",
     [FAULTS[0] + "::test_workers_of_a_killed_parent_stop_save_and_resume"]),
    ("faults: a plugin's time limit ignores RELBENCH_PLUGIN_TIMEOUT", "relbench/positions/plugins.py",
     "        seconds = float(text) if text else DEFAULT_TIMEOUT", "        seconds = DEFAULT_TIMEOUT", FAULTS),
    ("cli: help rewraps the examples into one paragraph", "relbench/cli/group.py",
     "            command.help = examples_kept(command.help)", "            pass",
     ["tests/test_cli.py::test_help_keeps_each_example_on_a_line_of_its_own"]),
    ("merge: --seeds folds every seed's checkpoints", "relbench/runs/merge.py",
     "    return (seeds is None or (seed.isdigit() and int(seed) in seeds)) and \\", "    return True and \\", MERGE),
    ("positions: a perplexity row's bins keyed with the row's n_tokens (a forced evaluation adds a second set)",
     "relbench/evaluation/evaluators.py", 'POSITIONS_KEY = [k for k in PERPLEXITY.key if k != "n_tokens"]',
     "POSITIONS_KEY = list(PERPLEXITY.key)", MERGE),
    ("plots: the answer's figure draws seeds that did not learn", "relbench/reporting/curves.py",
     "    for seed in r.learned_seeds:", "    for seed in r.seeds:", PLOTS),
    ("plots: a form or option of a scheme gets a colour of its own", "relbench/reporting/style.py",
     "index = names.index(base) if base in names", "index = names.index(variant) if variant in names", PLOTS),
    ("plots: a perplexity line that stops early is not said to", "relbench/reporting/plots.py",
     'if last["length"] < longest else', 'if False else', PLOTS),
    ("docs: the README's headline table drifts from the committed results", "scripts/readme_headline.py",
     '        return "not learned"', '        return "-"',
     [DOCS[0] + "::test_the_readme_is_short_and_its_headline_is_the_committed_results_own"]),
    ("decide: the projection counts pairs that need more seeds than it projects", "relbench/evaluation/decisions.py",
     "c.seeds_needed is not None and c.seeds_needed <= seeds", "c.seeds_needed is not None", DECIDE),
    ("decide: one scheme against a panel is decided with every pair of the panel", "relbench/comparisons.py",
     "return decide_family([(subject, other) for other in values if other != subject], values, margin, alpha, noise)",
     "return [c for c in compare_all(values, margin, alpha, noise) if subject in (c.a, c.b)]", DECIDE),
    ("findings: the prediction interval forgets the new seed's own spread", "relbench/reporting/findings.py",
     "s.std ** 2 * (1 + 1 / s.n) + trial_variance", "s.std ** 2 / s.n + trial_variance", FINDINGS),
    ("findings: a fresh seed's own trial noise left out of its verdict", "relbench/reporting/findings.py",
     "return prediction_interval(list(self.panel.values()), self.noise.get(seed, 0.0))",
     "return prediction_interval(list(self.panel.values()))", FINDINGS),
    ("findings: the summary number read at the run's lengths, not the panel's", "relbench/reporting/findings.py",
     "values, noise = decisions.beyond_values({variant: mine}, decided.beyond)",
     "values, noise = decisions.beyond_values({variant: mine}, decided.beyond[:1])", FINDINGS),
    ("the main job trains the preset's whole list again", "relbench/cli/bench.py",
     "    return list(MAIN_PANEL)\n", "    return None\n", FINDINGS),
    ("--jobs counts one process's imports for every run side by side", "relbench/cli/common.py",
     "        + resident.SIDE_PROCESS   # each run", "        + 0   # each run", JOBS),
    ("a run's expected end from its steps done, not those left", "relbench/training/jobs.py",
     "left = elapsed / step * (steps - step)", "left = elapsed / step * step", FINDINGS),
    ("flipflop: a read's bit is not the last write's", "relbench/tasks/flipflop.py",
     "bits = np.where(ops == 1, bits[last_write], bits)", "bits = np.where(ops == 1, bits, bits)", FLIPFLOP),
    ("flipflop: the first instruction not forced to a write", "relbench/tasks/flipflop.py",
     "ops[0], ops[-1] = 0, 1", "ops[-1] = 1", FLIPFLOP),
    ("flipflop: p_ignore taken as the write probability", "relbench/tasks/flipflop.py",
     "p=[(1 - trial.p_ignore) / 2, (1 - trial.p_ignore) / 2, trial.p_ignore]",
     "p=[trial.p_ignore, (1 - trial.p_ignore) / 2, (1 - trial.p_ignore) / 2]", FLIPFLOP),
    ("flipflop: a read's distance from the start, not from the last write", "relbench/tasks/flipflop.py",
     "return tokens, pad + 2 * reads, 2 * (reads - last_write[reads])", "return tokens, pad + 2 * reads, 2 * reads",
     FLIPFLOP),
    ("flipflop: training weights the bit after the read's, not the read's", "relbench/tasks/flipflop.py",
     "weights[row, torch.from_numpy(reads)] = float(answer_weight)",
     "weights[row, torch.from_numpy(reads) + 1] = float(answer_weight)", FLIPFLOP),
    ("tasks: a binned task's answers binned one token short", "relbench/tasks/base.py",
     "bins.setdefault(distance_bin(answer.distance), []).append(answer.correct)",
     "bins.setdefault(distance_bin(answer.distance - 1 or 1), []).append(answer.correct)", FLIPFLOP),
    ("tasks: an unknown task option accepted", "relbench/tasks/base.py",
     "unknown_keys = sorted(set(given) - set(self.defaults))", "unknown_keys = []", FLIPFLOP),
    ("tasks: a task registered after the shipped ones is never evaluated", "relbench/evaluation/evaluators.py",
     "**{task.name: RetrievalEvaluator(task) for task in retrieval_tasks()}}",
     "**{task.name: RetrievalEvaluator(task) for task in retrieval_tasks()[:-1]}}", REGISTRY),
    ("tasks: the report's tables only for the shipped retrieval tasks", "relbench/reporting/report.py",
     "*((task.csv, task.title()) for task in retrieval_tasks())]",
     "*((task.csv, task.title()) for task in retrieval_tasks()[:-1])]", REGISTRY),
    ("layouts: a none layer refuses a layout's random positions", "relbench/positions/spec.py",
     'if not layer.cls.takes_positions and layer.cls.family != "none"]', "if not layer.cls.takes_positions]", LAYOUTS),
    ("layouts: a none layer handed the drawn positions", "relbench/positions/base.py",
     'if positions is None or self.family == "none":', "if positions is None:", LAYOUTS),
    ("tasks: a length's accuracy weighs a condition by its answers", "relbench/evaluation/reach.py",
     'accuracy=("accuracy", "mean"), n=("n", "sum")).reset_index()',
     'accuracy=("accuracy", "max"), n=("n", "sum")).reset_index()', FLIPFLOP),
    ("tasks: the criterion pools a weighed task's answers", "relbench/tasks/base.py",
     "by_value.setdefault(answer.trial // per_value, []).append(answer.correct)",
     "by_value.setdefault(0, []).append(answer.correct)", FLIPFLOP),
    ("tracking: the curriculum ignored (every hop count from the first step)", "relbench/tasks/tracking.py",
     "allowed = tuple(h for h in every if h <= every[0] + (every[-1] - every[0]) * (1 - lowest)) or every[:1]",
     "allowed = every", TRACKING),
    ("needles: the curriculum ignores the distractors", "relbench/tasks/needles.py",
     "allowed = [v for v in self.axis_values if v <= max(self.axis_values) * (1 - lowest)] or [self.axis_values[0]]",
     "allowed = list(self.axis_values)", NEEDLES),
    ("chunks: a query sees the keys of the next chunk", "relbench/attention/__init__.py",
     "hidden = hidden | (queries[:, None] != torch.arange(k_start, k_end, device=device)[None, :] // chunk)",
     "hidden = hidden | (queries[:, None] < torch.arange(k_start, k_end, device=device)[None, :] // chunk)", LAYOUTS),
    ("chunks: the chunked path's blocks start at the sequence, not the chunk", "relbench/attention/__init__.py",
     "first = max(first, (offset + start) // chunk * chunk) if chunk else first", "first = first", LAYOUTS),
    ("chunks: a model layer never given its chunk", "relbench/model.py",
     "self.window, self.chunk = layer.window, layer.chunk", "self.window, self.chunk = layer.window, 0", LAYOUTS),
    ("needles: distractor keys may repeat the asked key", "relbench/tasks/needles.py",
     "names = rng.choice(len(NAMES), count, replace=False)", "names = rng.choice(len(NAMES), count, replace=True)",
     NEEDLES),
    ("needles: a needle's place ignores the needles before it (distances off)", "relbench/tasks/needles.py",
     "starts.append(point + placed)", "starts.append(point)", NEEDLES),
    ("needles: one right digit passes a trial", "relbench/tasks/base.py", "bool(correct.all())", "bool(correct.any())",
     NEEDLES),
    ("needles: training weights one position early", "relbench/tasks/needles.py",
     "weights[:, length - n_digits: length] = float(answer_weight)",
     "weights[:, length - n_digits - 1: length - 1] = float(answer_weight)", NEEDLES),
    ("tracking: the answer one variable short of the chain", "relbench/tasks/tracking.py",
     "k in letters[c * (hops + 1): (c + 1) * (hops + 1)]", "k in letters[c * (hops + 1): (c + 1) * (hops + 1) - 1]",
     TRACKING),
    ("tracking: every hop assigns the first variable", "relbench/tasks/tracking.py",
     "trial.values[c] if j == 0 else trial.names[c][j - 1]", "trial.values[c] if j == 0 else trial.names[c][0]",
     TRACKING),
    ("tracking: the distractor chain holds the asked value", "relbench/tasks/tracking.py",
     "rng.choice(10 ** DIGITS, chains, replace=False)", "rng.choice(10 ** DIGITS, 1).repeat(chains)", TRACKING),
    ("tracking: distances to the question's end, not its start", "relbench/tasks/tracking.py",
     "distances = np.asarray([asked - starts[0, j] for j in range(hops + 1)])",
     "distances = np.asarray([asked + len(question) - starts[0, j] for j in range(hops + 1)])", TRACKING),
]


def mutate(copy: Path, file: str, old: str, new: str) -> None:
    path = copy / file
    text = path.read_text()
    if text.count(old) != 1:
        raise SystemExit(f"mutation target not found exactly once in {file}: {old!r} (update tests/mutation_check.py)")
    path.write_text(text.replace(old, new))


def copy_pages(copy: Path) -> None:
    """What the documentation tests read beside the package: the README, docs/, scripts/ and results/
    (without its checkpoints, which no page names)."""
    shutil.copy(ROOT / "README.md", copy / "README.md")
    for folder in ("docs", "scripts", "examples"):
        if (ROOT / folder).is_dir():
            shutil.copytree(ROOT / folder, copy / folder)
    shutil.copytree(ROOT / "results", copy / "results", ignore=shutil.ignore_patterns("checkpoints"))


def run_tests(copy: Path, tests: list[str]) -> tuple[int, str]:
    """pytest's exit code on the copy (0 passed, 1 tests failed, other: the run itself failed) and the
    last line it printed."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=copy, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return done.returncode, lines[-1] if lines else done.stderr.strip()[-200:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="only mutations whose name contains this")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--tests", nargs="+", default=CORE_TESTS, help="for the mutations without tests of their own")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if args.k in m[0]]
    if args.list:
        print("\n".join(name for name, *_ in chosen))
        return 0
    survived = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, file, old, new, *tests in chosen:
            copy = Path(scratch) / "copy"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(ROOT / "relbench", copy / "relbench")
            shutil.copytree(ROOT / "tests", copy / "tests")
            shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
            if not file.startswith(("relbench/", "tests/")):    # a script and the pages it writes (test_docs)
                copy_pages(copy)
            mutate(copy, file, old, new)
            start = time.perf_counter()
            code, last = run_tests(copy, tests[0] if tests else args.tests)
            verdict = {0: "SURVIVED", 1: "killed"}.get(code, f"ERROR {code}")   # 4: a test id not found
            print(f"{verdict:<8} {time.perf_counter() - start:5.0f}s  {name}   ({last})", flush=True)
            if code != 1:
                survived.append(name)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutations killed" +
          (f"; survived or errored: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
