"""Loading models, once for the whole engine: GRPO training, the Tinker host and serving.

`loading.load_pretrained` loads a base model and its tokenizer (the dtype by device and role
from `dtypes`, the pad token set, saved adapters merged in order, the CPU weight layout of
`layout`); `lora` builds a LoRA from the caller's rank, alpha, targets and dropout, and saves,
loads and merges adapters. Nothing here knows a job, a run or a request: the callers do.
"""
