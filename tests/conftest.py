import os

import torch

# Triton kernels run in the interpreter where there is no GPU; the variable must be
# set before any kernel module is imported, and conftest is imported first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
