"""The Tinker engine: many LoRA training runs on one base model (issue 35).

`host.LoraHost` holds one base model and serves every run's `forward`, `forward_backward`,
`optim_step`, `sample` and state requests, each run its own peft adapter and Adam state;
`types` are the plain dataclasses the service builds from the official SDK's JSON (no torch).
"""
