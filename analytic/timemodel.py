"""The time and memory model: one vectorised evaluation used by predict, search and validate.

Per micro-batch and pipeline stage (seed 004 for compute, Megatron for TP/PP):

    t_transformer = layer FLOPs / (peak * gemm_efficiency(x))      x = FLOPs per matmul
                    + element-wise HBM traffic / HBM bandwidth      (formulas.vector_traffic)
    t_compute     = t_transformer / (k1(x) * k2(x))                 seed 004
    t_tp          = collectives of b s d per layer (4 all-reduces, or 4 RS + 4 AG with
                    sequence parallelism; 6 with full recompute), never overlapped
    t_pp          = 2 v send/recv of b s d / t per micro-batch (scatter/gather)

    iteration     = m * (stage + LM head) + (p - 1) / v * stage      1F1B / interleaved
                    + exposed DP/ZeRO collectives + optimizer step

The DP/ZeRO collectives run over the stage's parameter shard (see :mod:`analytic.comm`);
with ``dp_overlap`` they hide under backward (and, for ZeRO-3, forward) compute and
only the excess is exposed.  Memory per GPU follows ZeRO's 16 bytes/parameter mixed
precision Adam and Korthikanti et al.'s activations (:mod:`analytic.formulas`).
Everything broadcasts: the same code times one strategy or a grid of millions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from calib.analytic import device_path as DP
from calib.analytic import dp_exposure as DX
from calib.analytic import formulas as F
from calib.analytic import mla as MLA
from calib.analytic import modern as X
from calib.analytic import sharded_pp as SPP
from calib.analytic import tp2d as T2
from calib.analytic import uneven as U
from calib.analytic import zero_overlap as ZO
from calib.analytic.bubble import pipeline_time_s
from calib.analytic.comm import group_time_s, members_per_node
from calib.analytic.memory import BYTES_GRAD, activations_bytes, logits_bytes, memory_per_gpu
from calib.analytic.shape_terms import attention_dims_factor, attention_proj_params, shape_terms, stage_params  # noqa: F401 (re-exported)
from calib.analytic.specs import HardwareSpec, ModelColumns, ModelSpec, hardware_for_device
from calib.analytic.strategy import Strategies
from calib.calibrate import device_step as D
from calib.calibrate.calibration import FITTED, UNIDENTIFIABLE, Calibration
from calib.calibrate.device_model import DeviceModel

from calib.core.collective_names import ALLGATHER, ALLREDUCE, REDUCE, REDUCESCATTER, SENDRECV
from calib.core.devices import same_device

ADAM_STEP_BYTES_PER_PARAM = 28.0  # read+write fp32 master, m, v (24) + read grad (2) + write fp16 weight (2)
VECTOR_PASSES = 5.0  # HBM traversals of the activation bytes by element-wise kernels (formulas)
#: attention core at the GEMM efficiency: a stated default (System.attn_eff_ratio)
ATTN_EFF_RATIO = 1.0
#: fused element-wise layers (Calculon's knob, seed 000; Megatron's fused bias-GeLU etc.): a kept
#: tensor is written once in forward and read once in backward, its gradient stays in registers:
#: 3 of the 5 traversals remain (calib's count, not a published number; recompute keeps 2/5).
FUSED_VECTOR_PASSES = 3.0

#: output columns in display order (all per iteration, per GPU unless named otherwise)
TIME_KEYS = (
    "kernel_transformer_s", "kernel_other_s", "dispatch_intra_s", "dispatch_inter_s",
    "tp_s", "pp_s", "ep_cp_exposed_s", "dp_allreduce_exposed_s", "dp_allgather_exposed_s", "dp_reducescatter_exposed_s",
    "bubble_s", "optimizer_s",
)  # fmt: skip


@dataclass(frozen=True)
class System:
    """What the model needs about the machine: the calibration plus the hardware spec.

    Node sharing (all optional; the defaults are one rank per device, as on GPUs):

    * ``ranks_per_node``: ranks the launcher places on one node (torchrun's
      ``--nproc-per-node``); None = the calibration's devices per node.  Communication
      groups are placed on nodes of this many ranks.
    * ``compute_slots_per_node``: how many ranks a node runs at full speed (devices, or on
      a CPU host cores / threads per rank, as fitted by ``calib fit``); None = devices
      per node.  r ranks on a node take max(1, r / slots) times as long for everything
      they do -- compute and the host-driven communication of gloo alike (time-sharing).

    When k2 was measured on traces (:attr:`k2_covers_other_kernels`), its (1 - k2) share
    already holds the element-wise, normalisation and optimizer kernels of the traced
    steps; the separate HBM-traffic and optimizer-step terms would count them twice and
    are left out.
    """

    cal: Calibration
    hw: HardwareSpec
    vector_passes: float = VECTOR_PASSES
    #: the attention core's efficiency over the GEMMs' (spec-default path only; a trace-fitted
    #: device model times attention itself).  1 is the stated default; a validation fit can
    #: identify it from rows of different sequence lengths (analytic.vfit)
    attn_eff_ratio: float = ATTN_EFF_RATIO
    ranks_per_node: int | None = None
    compute_slots_per_node: float | None = None

    @property
    def device_model(self) -> DeviceModel | None:
        """The calibration's device model, moved to this hardware spec when it is another device."""
        dm = self.cal.device_model
        if dm is None or not dm.families:
            return None
        if same_device(dm.device, self.hw.device):
            return dm
        # compute rates scale with the devices' measured achievable matmul where both are known
        src = hardware_for_device(dm.device)
        both = src is not None and src.mamf_tflops and self.hw.mamf_tflops
        return dm.on(
            self.hw.peak_tflops, self.hw.hbm_tbps, self.hw.mamf_tflops / src.mamf_tflops if both else None
        )

    @property
    def peak_flops(self) -> float:
        dm = self.device_model
        if dm is not None and dm.peak_tflops:
            return float(dm.peak_tflops) * 1e12
        return float(self.cal.peak_tflops or self.hw.peak_tflops) * 1e12

    @property
    def gpus_per_node(self) -> int:
        """Ranks per node: what placement and the collective curves see."""
        return int(self.ranks_per_node or self.cal.gpus_per_node)

    @property
    def slots_per_node(self) -> float:
        return float(self.compute_slots_per_node or self.cal.gpus_per_node)

    @property
    def comm_cal(self) -> Calibration:
        """The calibration with nodes of ``ranks_per_node`` ranks (intra-node curves inside them)."""
        if self.ranks_per_node and self.ranks_per_node != self.cal.gpus_per_node:
            return replace(self.cal, gpus_per_node=int(self.ranks_per_node))
        return self.cal

    @property
    def k2_covers_other_kernels(self) -> bool:
        """k2 fitted on traces (status fitted, or unidentifiable from one work level)."""
        k2 = self.cal.k2_curve
        return k2 is not None and k2.y_max.status in (FITTED, UNIDENTIFIABLE)

    def node_share(self, ranks: np.ndarray) -> np.ndarray:
        """Time-sharing factor of a job of ``ranks`` ranks: max(1, ranks on one node / slots)."""
        on_node = np.minimum(np.asarray(ranks, dtype=float), float(self.gpus_per_node))
        return np.maximum(1.0, on_node / self.slots_per_node)


def dispatch_split(cal: Calibration) -> float:
    """Intra-op share of dispatch time, from the calibration's per-operator host costs."""
    intra = cal.dispatch.get("intra_op_s_per_op")
    inter = cal.dispatch.get("inter_op_s_per_op")
    if intra is None or inter is None or intra.value + inter.value <= 0:
        return 0.5
    return intra.value / (intra.value + inter.value)


def comm_times(model: ModelSpec | ModelColumns, system: System, st: Strategies) -> dict[str, np.ndarray]:
    """Seconds of one of each collective the strategies issue (calibration contract only).

    TP: b s d activations in the TP group (ranks adjacent); PP: b s d / t to the next
    stage (ranks tp * dp apart); DP: the stage's fp16 gradients/parameters in the DP
    group (ranks tp apart).  Depends only on the layout, so the search evaluates it on
    the (layouts x 1) slice of its grid and fits reuse it.
    """
    cal, gpn = system.comm_cal, system.gpus_per_node
    d, L, s, V = (
        np.asarray(x, dtype=float) for x in (model.d_model, model.n_layers, model.seq_len, model.vocab)
    )
    t, p, dp, b = (x.astype(float) for x in (st.tp, st.pp, st.dp, st.micro_batch))
    ffn, kv_frac, mats, tied = shape_terms(model)
    s_loc, ffn_c, _ = X.local_shape(model, st, s, ffn)
    act_bytes = F.BYTES_PER_VALUE * b * s_loc * d
    k_tp = members_per_node(t, 1, gpn)
    k_pp = members_per_node(2, t * st.cp * dp, gpn)
    shared, routed = X.moe_params(model, d, t, p, st.ep, mats)
    t_w = T2.weight_split(t, st.tp_c, st.tp2d_kind)  # 2D table: weights over tp_r only
    attn_w = attention_proj_params(model)  # attention projection weights per layer (MLA: low rank)
    grad_bytes = BYTES_GRAD * (stage_params(d, L, s, V, t_w, p, ffn_c, kv_frac, mats, tied, attn_w) + shared)
    exp_bytes = BYTES_GRAD * routed

    def dp_t(coll, per=1.0):
        return X.dp_time_s(cal, gpn, coll, grad_bytes / per, exp_bytes / per, st)

    # ZeRO-3 gathers and reduce-scatters one collective at a time, each paying the group's
    # latency: per module (FSDP; n_mod = layers + embedding) or per tensor / bucket (DeepSpeed)
    n_mod = U.stage_layers(L, p)[0] + 1.0
    ds = np.asarray(st.zero_impl) == DX.DEEPSPEED
    n_ag, n_rs = ZO.collective_counts(n_mod - 1.0, grad_bytes / BYTES_GRAD, d, ffn, kv_frac, mats, t_w, ds, model, st.ep, MLA.depths(model) * (p == 1))  # fmt: skip

    out = {
        **X.comm_extra(model, cal, gpn, st, b, s, d, kv_frac),
        "tp_ar_s": group_time_s(cal, ALLREDUCE, act_bytes, t, k_tp),
        "tp_ag_s": group_time_s(cal, ALLGATHER, act_bytes, t, k_tp),
        "tp_rs_s": group_time_s(cal, REDUCESCATTER, act_bytes, t, k_tp),
        "pp_p2p_s": group_time_s(cal, SENDRECV, act_bytes / t, np.where(p > 1, 2.0, 1.0), k_pp),
        "dp_ar_s": dp_t(ALLREDUCE),
        "dp_ag_s": dp_t(ALLGATHER),
        "dp_rs_s": dp_t(REDUCESCATTER),
        "dp_reduce_s": dp_t(REDUCE),  # DeepSpeed ZeRO-2 issues reduces
        "dp_ag_z3_s": n_ag * dp_t(ALLGATHER, n_ag),
        "dp_rs_z3_s": n_rs * dp_t(REDUCESCATTER, n_rs),
        # hybrid sharding: each module's gradient shard all-reduced across the replicas (analytic.hybrid)
        "dp_hsdp_ar_s": n_mod * X.replica_allreduce_s(cal, gpn, grad_bytes / n_mod, exp_bytes / n_mod, st),
    }
    if np.any(st.tp_c > 1):  # 2D TP grids (seed 002): their own collectives (analytic.tp2d)
        g2 = T2.comm_times_2d(cal, gpn, st, b, s_loc, d, ffn_c, kv_frac, grad_bytes)
        two = st.tp_c > 1
        out.update(
            {k: np.where(two, g2[k], out[k]) for k in ("tp_ag_s", "tp_rs_s")}, tp2d_grad_s=g2["tp2d_grad_s"]
        )
    return out


def evaluate(
    model: ModelSpec | ModelColumns,
    system: System,
    st: Strategies,
    comm: dict[str, np.ndarray] | None = None,
    lean: bool = False,
) -> dict[str, np.ndarray]:
    """Iteration time breakdown, memory and throughput for every strategy in ``st``.

    ``model`` is one ModelSpec or per-strategy ModelColumns (validation tables).
    ``lean``: only ``iter_s``, ``mem_total_bytes`` and ``oom`` (the search's grid pass).
    """
    cal, hw = system.cal, system.hw
    peak = system.peak_flops
    d, L, a, s, V = (
        np.asarray(x, dtype=float)
        for x in (model.d_model, model.n_layers, model.n_heads, model.seq_len, model.vocab)
    )

    t = st.tp.astype(float)
    p = st.pp.astype(float)
    dp = st.dp.astype(float)
    b = st.micro_batch.astype(float)
    v = st.interleave.astype(float)
    rc = st.recompute
    sp = st.seq_parallel
    B = st.global_batch.astype(float)
    m = B / (dp * b)
    # layers of the largest and the last stage (analytic.uneven); MTP blocks are layers of it
    lps, lps_last = U.stage_layers(L + MLA.depths(model), p)
    full = rc == F.FULL

    # ranks sharing a node's compute slots run everything that much slower (1 on GPUs)
    share = system.node_share(t * st.cp * p * dp)
    covered = system.k2_covers_other_kernels
    # fused element-wise layers take FUSED_VECTOR_PASSES of the 5 traversals; with a traced
    # k2 (unfused kernels inside it) the removed ones come off the kernel time instead
    fuse_cut = np.where(st.fused_layers, VECTOR_PASSES - FUSED_VECTOR_PASSES, 0.0)
    vec_passes = 0.0 if covered else np.maximum(system.vector_passes - fuse_cut, 0.0)

    # ---- compute, per layer and per micro-batch ----------------------------------------
    # (s_loc: the s / CP tokens of a GPU; ffn_c: dense MLP width averaged over MoE layers)
    ffn, kv_frac, mats, tied = shape_terms(model)
    s_loc, ffn_c, flash = X.local_shape(model, st, s, ffn)
    attn_w = attention_proj_params(model)  # attention projection weights per layer (MLA: low rank)
    f_fwd = F.forward_flops_layer(b, s_loc, d, ffn_c, kv_frac, mats, attn_w) / t
    f_train = F.training_flops_layers(b, s_loc, d, 1.0, rc, ffn_c, kv_frac, mats, attn_w, MLA.op_sac_terms(model)) / t  # fmt: skip
    f_head = F.lm_head_flops(b, s_loc, d, V) / t
    # the attention core: 4 b s^2 d / t in the formulas, x the model's head widths (MLA)
    attn_fwd = X.attn_fwd_flops(b, s_loc, d, t)
    mla = attention_dims_factor(model)
    attn_x = mla * X.cp_attention_extra_flops(b, s_loc, d, t, st.cp, rc)
    # attention FLOPs beyond f_train's count: flash's recomputed Q K^T in backward, MLA's widths
    attn_more = X.CP.flash_backward_extra_flops(mla * attn_fwd, flash)
    attn_more = attn_more + (mla - 1.0) * attn_fwd * (3.0 + F.attention_recomputed(rc))
    dm = system.device_model
    a_ratio = 1.0 if dm is not None else float(system.attn_eff_ratio)
    if dm is not None:  # the physical device model fitted from GPU traces
        fam, fam_note = dm.family(model.shape_extras["mlp"])
        sh = replace(DP.shape_of(model), s=s_loc, ffn=ffn_c)
        r8 = DP.fp8_speedup(dm, hw)  # FP8 GEMMs: traced speed-up, else the datasheet ratio
        lt = DP.layer_terms(dm, fam, sh, b, t, sp, rc, flash, st.fp8, r8, mla)
        ht = DP.head_terms(dm, fam, sh, b, t)
        layer_tr, layer_kernel = share * lt["transformer"], share * (lt["transformer"] + lt["stream"])
        head_tr, head_kernel = share * ht["transformer"], share * (ht["transformer"] + ht["stream"])
        layer_compute, head_compute = layer_kernel, head_kernel
        eff = f_train / np.maximum(lt["transformer"], 1e-30) / peak
        k1 = k2 = 1.0
    else:
        x = f_fwd / 6.0  # mean FLOPs of the six forward matmuls of a layer
        eff, k1, k2 = cal.gemm_efficiency(x), cal.k1(x), cal.k2(x)
        vec_bytes = F.vector_traffic_bytes_layer(b, s_loc, d, a, t, sp, rc, flash, vec_passes)
        gemm, casts = X.gemm_and_casts(
            st, hw, f_train, attn_fwd, rc, peak, eff, b * s_loc, d, ffn_c, kv_frac, mats, t, attn_more, a_ratio, MLA.linear_io(MLA.attention_linears(model))
        )  # fmt: skip
        layer_tr = share * (gemm + (vec_bytes + casts) / (hw.hbm_tbps * 1e12))
        layer_kernel = layer_tr / k2
        if covered and np.any(st.fused_layers):
            saved = F.vector_traffic_bytes_layer(b, s_loc, d, a, t, sp, rc, flash, fuse_cut)
            layer_kernel = np.maximum(layer_tr, layer_kernel - share * saved / (hw.hbm_tbps * 1e12))
        layer_compute = layer_kernel / k1

        x_head = f_head / 3.0
        eh, k1h, k2h = cal.gemm_efficiency(x_head), cal.k1(x_head), cal.k2(x_head)
        head_tr = share * f_head / (peak * eh)
        head_kernel = head_tr / k2h
        head_compute = head_kernel / k1h
    # CP: attention over all s keys; MoE: the experts of the average layer (own GEMM efficiency)
    extra = (
        share
        * X.extra_compute_s(model, system, st, b, s_loc, d, t, mats, rc, attn_x, eff, peak, a_ratio)
        / (k1 * k2)
    )
    layer_tr, layer_kernel, layer_compute = (
        layer_tr + extra * k1 * k2,
        layer_kernel + extra * k1,
        layer_compute + extra,
    )

    # ---- communication (layout-level arrays; cached across fits) -----------------------
    c = comm if comm is not None else comm_times(model, system, st)
    if np.any(share != 1.0):
        c = {k: v * share for k, v in c.items()}
    n_tp = np.where(full, 6.0, 4.0)
    tp_layer = X.tp_exposed(n_tp * np.where(sp, c["tp_ag_s"] + c["tp_rs_s"], c["tp_ar_s"]), layer_compute, st)
    pp_mb = 2.0 * v * c["pp_p2p_s"]
    attn_core_s = (
        share * (attn_x + attn_more + attn_fwd * (3.0 + F.attention_recomputed(rc))) / (peak * eff * a_ratio)
    )
    xl_total, xl_exposed = X.layer_comm(model, st, c, rc, layer_compute, attn_core_s)

    head_tr, head_kernel, head_compute = MLA.with_mtp(model, d, V, (head_tr, head_kernel, head_compute))
    stage_mb = lps * (layer_compute + tp_layer + xl_exposed) + pp_mb
    head_mb = U.head_excess_s(
        head_compute, layer_compute + tp_layer + xl_exposed, lps, lps_last, st.schedule
    )  # = head when even
    fwd_sh, w_sh = X.schedule_shares(f_fwd, f_train, attn_fwd)
    # the bubble runs at the pace of the slowest virtual stage (analytic.uneven): v x its layers
    chunk_stage = (
        v * U.chunk_layers(L + MLA.depths(model), p, v) * (layer_compute + tp_layer + xl_exposed) + pp_mb
    )
    pipeline, bubble = pipeline_time_s(stage_mb, head_mb, p, m, v, st.schedule, fwd_sh, w_sh, chunk_stage)

    # ---- data parallel / ZeRO over the stage's parameter shard -------------------------
    shared_p, expert_p = X.moe_params(model, d, t, p, st.ep, mats)
    w_split = T2.weight_split(t, st.tp_c, st.tp2d_kind)
    dense_p = stage_params(d, L, s, V, w_split, p, ffn_c, kv_frac, mats, tied, attn_w) + shared_p
    emb = V * d * np.where(tied | (p > 1), 1.0, 2.0) / w_split  # embedding and LM head: bf16 under FP8
    params_gpu = dense_p + expert_p
    bwd_window = lps * layer_compute * (f_train - f_fwd) / f_train
    fwd_window = lps * layer_compute * f_fwd / f_train
    dpt = DX.dp_terms(st, c, m, full, bwd_window, fwd_window, lean)  # analytic.dp_exposure
    dp_ar, dp_ag, dp_rs, dp_exposed = dpt["dp_ar"], dpt["dp_ag"], dpt["dp_rs"], dpt["dp_exposed"]

    # ---- optimizer step (memory bound) -------------------------------------------------
    opt_params = X.opt_params(st, dense_p, expert_p)
    adam_bytes = ADAM_STEP_BYTES_PER_PARAM - np.where(st.master == 1, 8.0, 0.0)  # no fp32 master read/write
    optimizer = share * opt_params * adam_bytes / (hw.hbm_tbps * 1e12)
    if system.k2_covers_other_kernels:
        optimizer = np.zeros_like(optimizer)
    host = np.zeros_like(optimizer)
    if dm is not None:
        optimizer = share * (
            D.optimizer_s(dm, fam, opt_params) + D.step_fixed_s(dm, fam, params_gpu - emb, emb)
        )
        host = DP.host_s(dm, fam, lps, m, X.moe_share(model) if X.MOE.is_moe(model) else 0.0, sh.attn is not None)  # fmt: skip

    dp_exposed = dp_exposed + c.get("tp2d_grad_s", 0.0)  # 2D TP: weight gradients over tp_c
    device_iter = (pipeline + optimizer) + dp_exposed
    # the host issues every kernel: a step takes at least its issue time (device model only)
    iter_s = D.step_s(device_iter, host, dm, fam) if dm is not None else device_iter

    # ---- memory per GPU (ZeRO-3 with PP holds ZeRO-1's states at the peak) --------------
    sm, g_mem = SPP.memory_strategies(st), X.groups(st)[0]
    if dm is not None:
        mem = DP.memory(dm, fam, sh, dense_p, b, t, p, g_mem, sm.zero, m, v, rc, sp, hw.runtime_reserve_gb * 1e9)  # fmt: skip
        if st.is_modern or X.MOE.is_moe(model) or MLA.uses_mla(model):
            mem = DP.adjust_dm_memory(
                mem, model, sm, dense_p - emb, expert_p, d, t, p, m, b, s_loc, mats, rc, fam
            )
    else:
        drop = bool(model.shape_extras.get("dropout", True))  # dropout masks kept (formulas)
        acts = activations_bytes(b, s_loc, d, a, L, V, t, p, m, v, rc, sp, flash, False, (ffn_c / d, kv_frac, mats, drop, MLA.attention_kept_coeffs(model), MLA.op_sac_terms(model)))  # fmt: skip
        lg = logits_bytes(b, s_loc, V, t, p)
        one = F.activation_bytes_layer(b, s_loc, d, a, t, sp, rc, flash, ffn_c / d, kv_frac, mats, drop, MLA.attention_kept_coeffs(model), MLA.op_sac_terms(model))  # fmt: skip
        acts = acts + MLA.mtp_activation_bytes(model, p, one, lg, st.schedule)  # analytic.mla
        big, lay = ZO.largest_matrix(d, t, ffn, kv_frac, model, mats, sm.ep), X.layer_params_gpu(model, t)  # fmt: skip
        if st.is_modern or X.MOE.is_moe(model):
            mem = X.memory(model, sm, dense_p, expert_p, acts, d, t, p, m, b, s_loc, mats, rc,
                           hw.runtime_reserve_gb * 1e9, lg, big, emb)  # fmt: skip
        else:
            ds = sm.zero_impl == DX.DEEPSPEED
            mem = memory_per_gpu(
                params_gpu, lay, g_mem, sm.zero, acts, hw.runtime_reserve_gb * 1e9, lg, (big, ds)
            )
    if lean:
        return {
            "iter_s": iter_s,
            "mem_total_bytes": mem["mem_total_bytes"],
            "oom": mem["mem_total_bytes"] + mem.get("mem_reserve_bytes", 0.0) > hw.hbm_bytes,
            "dp_exposed_s": dp_exposed,  # the placement axis scales its DP change by this share
        }

    # ---- breakdown (per iteration) -----------------------------------------------------
    ar_exp, ag_exp, rs_exp = dpt["ar_exp"], dpt["ag_exp"], dpt["rs_exp"]
    # uneven stages: only the LM head's excess over the last stage's gap is on the critical path
    head_cp = np.where(head_compute > 0, head_mb / np.maximum(head_compute, 1e-30), 1.0)
    kernel_tr = m * (lps * layer_tr + head_cp * head_tr)
    kernel_all = m * (lps * layer_kernel + head_cp * head_kernel)
    compute_all = m * (lps * layer_compute + head_cp * head_compute)
    if dm is not None:  # device idle while the host issues: the step's gaps and any host excess
        compute_all = compute_all + (iter_s - device_iter)
    dispatch = compute_all - kernel_all
    share = dispatch_split(cal)
    tp_total = m * lps * tp_layer
    pp_total = m * pp_mb
    epcp_total, epcp_exposed = m * lps * xl_total, m * lps * xl_exposed
    comm_total = tp_total + pp_total + dp_ar + dp_ag + dp_rs + epcp_total
    comm_exposed = tp_total + pp_total + ar_exp + ag_exp + rs_exp + epcp_exposed

    # ---- throughput --------------------------------------------------------------------
    gpus = t * st.cp * p * dp
    model_fl, hw_fl = MLA.iteration_flops(model, B, rc, ffn_c, attn_w)  # MoE experts and MTP included

    return {
        "iter_s": iter_s,
        "kernel_transformer_s": kernel_tr,
        "kernel_other_s": kernel_all - kernel_tr,
        "dispatch_intra_s": dispatch * share,
        "dispatch_inter_s": dispatch * (1.0 - share),
        "tp_s": tp_total,
        "pp_s": pp_total,
        "ep_cp_s": epcp_total,
        "ep_cp_exposed_s": epcp_exposed,
        "dp_allreduce_s": dp_ar,
        "dp_allgather_s": dp_ag,
        "dp_reducescatter_s": dp_rs,
        "dp_allreduce_exposed_s": ar_exp + c.get("tp2d_grad_s", 0.0),
        "dp_allgather_exposed_s": ag_exp,
        "dp_reducescatter_exposed_s": rs_exp,
        "bubble_s": bubble,
        "optimizer_s": optimizer,
        "compute_s": compute_all,
        "comm_s": comm_total,
        "comm_exposed_s": comm_exposed,
        "comm_overlapped_s": comm_total - comm_exposed,
        **mem,
        "oom": mem["mem_total_bytes"] + mem.get("mem_reserve_bytes", 0.0) > hw.hbm_bytes,
        "microbatches": m,
        "tokens_per_s": B * s / iter_s,
        "model_tflops_per_gpu": model_fl / (iter_s * gpus) / 1e12,
        "hw_tflops_per_gpu": hw_fl / (iter_s * gpus) / 1e12,
        "mfu": model_fl / (iter_s * gpus) / peak,
        "gemm_efficiency": eff,
        "host_issue_s": host,  # kernel issue (device model; else 0): host-bound where it is iter_s
    }
