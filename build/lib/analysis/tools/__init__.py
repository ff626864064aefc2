"""The built-in analysis tools, registered in this order (the report's order).

A new tool is one module here that defines and `register`s its `Tool`, and one
line below.
"""
from analysis.tool import TOOLS, Tool, register  # noqa: F401  (the registry, re-exported)
from analysis.tools import cka  # noqa: F401
from analysis.tools import similarities  # noqa: F401
from analysis.tools import attention_distance  # noqa: F401
from analysis.tools import head_cka  # noqa: F401
from analysis.tools import head_similarities  # noqa: F401
from analysis.tools import norm_ratio  # noqa: F401
from analysis.tools import erf  # noqa: F401
from analysis.tools import probes  # noqa: F401
from analysis.tools import localisation  # noqa: F401
from analysis.tools import localisation_similarities  # noqa: F401
from analysis.tools import vit_figures  # noqa: F401
from analysis.tools import hessian  # noqa: F401
from analysis.tools import landscape  # noqa: F401
from analysis.tools import fourier  # noqa: F401
from analysis.tools import robustness  # noqa: F401
from analysis.tools import nll  # noqa: F401
from analysis.tools import calibration  # noqa: F401
from analysis.tools import lesion  # noqa: F401
from analysis.tools import head_ablation  # noqa: F401
from analysis.tools import logit_lens  # noqa: F401
from analysis.tools import artifact_tokens  # noqa: F401
from analysis.tools import activation_patching  # noqa: F401
from analysis.tools import corruption  # noqa: F401
from analysis.tools import sae  # noqa: F401
