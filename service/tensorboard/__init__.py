"""A job's TensorBoard event files, downloaded (`report_to: [tensorboard]`)."""
