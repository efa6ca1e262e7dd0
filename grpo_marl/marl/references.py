"""Reference policies that put learned returns on a scale: uniform random, and for simple_spread
a scripted greedy landmark assignment.

They act through the interface of :class:`~grpo_marl.policies.mlp.ActorPolicy` (``act(obs[E, A, D],
action_mask, deterministic) -> (actions[E, A], logp[E, A])``, ``to_env``, ``groups``), so they are
evaluated by the one evaluation loop, :func:`grpo_marl.collectors.evaluate_policy`, on any
:class:`~grpo_marl.vec.base.VecEnv`. It reports the *mean per-agent episode return* (the sum of an
agent's rewards over one episode, averaged over agents and episodes, mpe2's default reward scale)
— the figure the benchmarks compare against.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import Tensor

from grpo_marl.errors import UnsupportedSpaceError
from grpo_marl.groups import AgentGroups


class ScriptedPolicy:
    """Base of the references: a numpy rule ``actions(obs[E, A, D], mask[E, A, K] | None) ->
    int[E, A]`` behind the actor interface the evaluation loop calls (discrete actions only)."""

    def __init__(self, groups: AgentGroups) -> None:
        continuous = [g for g, spec in groups.specs.items() if not spec.discrete]
        if continuous:
            raise UnsupportedSpaceError(
                f"scripted references take discrete actions; groups {continuous} are continuous"
            )
        self.groups = groups
        self.n_actions = np.array([groups.specs[groups.group_of[a]].n_actions for a in groups.agents])

    def actions(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        raise NotImplementedError

    @torch.no_grad()
    def act(self, obs: Tensor, action_mask: Tensor | None = None, deterministic: bool = True) -> tuple[Tensor, Tensor]:
        mask = None if action_mask is None else action_mask.cpu().numpy()
        actions = torch.as_tensor(self.actions(obs.cpu().numpy(), mask), dtype=torch.long, device=obs.device)
        return actions, torch.zeros(actions.shape, device=obs.device)

    def to_env(self, actions: Tensor) -> np.ndarray:
        return actions.cpu().numpy()


class RandomPolicy(ScriptedPolicy):
    """Uniform over each agent's valid actions (its own action count; env action masks where
    the env hands them out)."""

    def __init__(self, groups: AgentGroups, seed: int = 0) -> None:
        super().__init__(groups)
        self.rng = np.random.default_rng(seed)

    def actions(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        e, a = obs.shape[:2]
        width = int(self.n_actions.max())
        valid = np.broadcast_to(np.arange(width) < self.n_actions[:, None], (e, a, width)).copy()
        if mask is not None:
            env_mask = mask[..., :width].astype(bool)
            usable = env_mask.any(-1, keepdims=True)  # finished agents: any action (ignored by the env)
            valid &= np.where(usable, env_mask, True)
        return (self.rng.random(valid.shape) * valid).argmax(-1)


class GreedyLandmarkPolicy(ScriptedPolicy):
    """Scripted simple_spread policy: greedy agent->landmark assignment, then a stopping-point
    controller that moves toward the assigned landmark.

    Each agent reconstructs every agent's and landmark's position from its *own* observation
    (``[vel, pos, landmark_rel * N, other_rel * (N-1), comm * (N-1)]``), so the policy is
    decentralized yet all agents agree on the assignment: repeatedly take the closest
    unassigned (agent, landmark) pair (``assignment="optimal"`` instead minimizes the summed
    distance over all permutations, feasible for small N). The controller picks the discrete
    action whose look-ahead point ``p + v dt + v' dt * lookahead`` (``v'`` the velocity after the
    action under mpe2's damping) is closest to the target; ``lookahead=1`` (measured best of
    1-4 on 500 episodes) brakes early enough to avoid overshoot without arriving late, while
    ``1/(1-keep) = 4`` (the full coasting rest point) is too timid.
    """

    # mpe2 physics: dt, damping, action sensitivity (accel), agent mass
    DT, DAMPING, ACCEL, MASS = 0.1, 0.25, 5.0, 1.0
    # action -> unit force (no-op, -x, +x, -y, +y), mpe2's discrete encoding
    FORCES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], dtype=np.float64)

    def __init__(self, groups: AgentGroups, assignment: str = "greedy", lookahead: float = 1.0) -> None:
        super().__init__(groups)
        if assignment not in ("greedy", "optimal"):
            raise ValueError(f"assignment must be 'greedy' or 'optimal', got {assignment!r}")
        self.n = len(groups.agents)
        self.mode = assignment
        self.lookahead = float(lookahead)

    def positions(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """From ``obs[E, A, D]`` -> agents ``[E, A(viewer), N, 2]``, landmarks ``[E, A, N, 2]``."""
        n = self.n
        pos = obs[..., 2:4]
        lms = pos[..., None, :] + obs[..., 4 : 4 + 2 * n].reshape(*obs.shape[:-1], n, 2)
        others = pos[..., None, :] + obs[..., 4 + 2 * n : 4 + 2 * n + 2 * (n - 1)].reshape(*obs.shape[:-1], n - 1, 2)
        agents = np.empty((*obs.shape[:-1], n, 2))
        for i in range(n):  # viewer i sees others in order with itself removed
            agents[:, i, :i] = others[:, i, :i]
            agents[:, i, i] = pos[:, i]
            agents[:, i, i + 1 :] = others[:, i, i:]
        return agents, lms

    def assignment(self, agents: np.ndarray, lms: np.ndarray) -> np.ndarray:
        """Assignment ``[..., N]`` (agent -> landmark) from positions ``[..., N, 2]``."""
        n = self.n
        lead = agents.shape[:-2]
        d = np.linalg.norm(agents[..., :, None, :] - lms[..., None, :, :], axis=-1).reshape(-1, n, n)
        if self.mode == "optimal":
            perms = np.array(list(itertools.permutations(range(n))))
            cost = d[:, np.arange(n)[None, :], perms].sum(-1)  # [K, n!]
            return perms[cost.argmin(-1)].reshape(*lead, n)
        out = np.empty((d.shape[0], n), dtype=np.int64)
        for k in range(d.shape[0]):
            m = d[k].copy()
            for _ in range(n):
                a, lm = np.unravel_index(np.argmin(m), m.shape)
                out[k, a] = lm
                m[a, :] = np.inf
                m[:, lm] = np.inf
        return out.reshape(*lead, n)

    def actions(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        obs = obs.astype(np.float64)
        agents, lms = self.positions(obs)
        assign = self.assignment(agents, lms)  # [E, viewer, N]
        e_idx, a_idx = np.meshgrid(np.arange(obs.shape[0]), np.arange(self.n), indexing="ij")
        target = lms[e_idx, a_idx, assign[e_idx, a_idx, a_idx]]  # [E, A, 2]
        pos, vel = obs[..., 2:4], obs[..., 0:2]
        keep = 1.0 - self.DAMPING
        # mpe2 integrates p' = p + v dt, then v' = keep v + F/m dt: look ahead along v'
        v_next = keep * vel[..., None, :] + self.FORCES * self.ACCEL / self.MASS * self.DT
        rest = pos[..., None, :] + vel[..., None, :] * self.DT + v_next * self.DT * self.lookahead
        err = np.linalg.norm(rest - target[..., None, :], axis=-1)  # [E, A, 5]
        return err.argmin(-1)
