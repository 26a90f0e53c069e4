"""Local Lipschitz constants of self-attention (Castin, Ablin, Peyré, "How Smooth Is Attention?", 2024).

The lab, one module per part (DESIGN.md, "Local Lipschitz constants"):
  measured.py   the functions measured: AttentionMap (one head, several heads, a model layer or one
                of its heads, as the model applies it under every config switch: rotary, score
                scale, window, q/k norms, sandwich post-attention norm), HeadNorm (a copy of one
                of the model's norms), module_function (the module itself)
  estimator.py  ||D_X f||_2 matrix-free: spectral_norm (batched Golub-Kahan-Lanczos), the paper's
                power_iteration, exact_jacobian_norm (small-case reference)
  bounds.py     Theorem 3.1: upper and lower bounds, gamma, the adversarial construction, map_bounds
  inputs.py     ball_inputs, real_inputs (windows of text), search_adversarial
  sources.py    the input-source registry (INPUT_SOURCES): one declaration per source
  fit.py        the growth exponent with its 95% CI
  sweep.py      SweepSpec (build_sweep_spec from plain options), run_sweep, sweep_label
  files.py      the CSV, the user's A and V (.npz), strict JSON
The attention weights and masks themselves come from core/attention.py, shared with the model.
Everything is re-exported here: `from desktop_app.core import lipschitz as lip; lip.run_sweep(...)`.
"""
from __future__ import annotations

from ..attention import ATTENTION_KINDS
from .bounds import (SINGULAR_RTOL, _adversarial_head, _bound_parameters, _construction, _gamma, _product_norm,
                     _real_pairs, adversarial_input, gamma_of, head_eigen, lower_bound, map_bounds, real_eigen,
                     upper_bound)
from .estimator import (DGKS_ETA, KATO_TEMPLE_SAFETY, MIN_STEPS, SpectralEstimate, _AutogradLinearization,
                        _batched_norm, _SoftmaxLinearization, exact_jacobian_norm, linearize, power_iteration,
                        published_power_iteration, spectral_norm)
from .files import CSV_COLUMNS, load_matrices, save_csv
from .fit import _student_t_quantile, fit_exponent
from .inputs import _pick, ball_inputs, real_inputs, search_adversarial, window_starts
from .measured import (AttentionMap, HeadNorm, layer_map, module_function, multi_head, random_single_head,
                       rotary_transpose, single_head)
from .sources import (INPUT_SOURCES, MODEL, SYNTHETIC, InputSource, SourceContext, get_source, register_source,
                      source_names, sources_for)
from .sweep import (DATA_KINDS, DEFAULT_SEARCH_STEPS, DEFAULT_SEED, DEFAULT_SYNTHETIC_D, DEFAULT_TOL,
                    LengthResult, SweepResult, SweepSpec, build_sweep_spec, data_kinds, observed_radius,
                    parse_lengths, run_sweep, sweep_function, sweep_label)
