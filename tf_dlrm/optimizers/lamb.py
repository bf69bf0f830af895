"""LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes").

Adam's moments with a per-layer trust ratio: for each weight tensor ``w`` (each kernel and each
bias is a "layer") with gradient ``g`` at step ``t``::

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g^2
    u = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon) + weight_decay * w
    w -= lr * (||w|| / ||u||) * u          (ratio 1 when either norm is 0)

The trust ratio keeps each layer's step proportional to its weights' size, which is what lets the
MLPs of DLRM train at global batches of 16K and more. Applied by the trainer to the gradient
averaged over ranks, so every rank computes the same norms and the same update.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tf_dlrm.optimizers.settings import check_adam_arguments


@keras.saving.register_keras_serializable(package="tf_dlrm")
class Lamb(keras.optimizers.Optimizer):
    """Args: learning_rate, beta_1, beta_2, epsilon (Adam's), weight_decay_rate (inside the trust
    ratio, decoupled from the moments as in the paper)."""

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-6, weight_decay_rate=0.0, name="lamb", **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        check_adam_arguments(beta_1, beta_2, epsilon)
        if weight_decay_rate < 0:
            raise ValueError(f"Expected weight_decay_rate >= 0. Received: weight_decay_rate={weight_decay_rate}")
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)
        self.weight_decay_rate = float(weight_decay_rate)

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._momentums = [self.add_variable_from_reference(reference_variable=v, name="momentum") for v in var_list]
        self._velocities = [self.add_variable_from_reference(reference_variable=v, name="velocity") for v in var_list]

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        gradient = tf.cast(gradient, variable.dtype)
        t = tf.cast(self.iterations + 1, variable.dtype)
        self.assign(m, self.beta_1 * m + (1.0 - self.beta_1) * gradient)
        self.assign(v, self.beta_2 * v + (1.0 - self.beta_2) * tf.square(gradient))
        m_hat = m / (1.0 - self.beta_1**t)
        v_hat = v / (1.0 - self.beta_2**t)
        update = m_hat / (tf.sqrt(v_hat) + self.epsilon)
        if self.weight_decay_rate:
            update += self.weight_decay_rate * variable
        weight_norm = tf.norm(variable)
        update_norm = tf.norm(update)
        ratio = tf.where((weight_norm > 0.0) & (update_norm > 0.0), weight_norm / tf.maximum(update_norm, 1e-30), 1.0)
        self.assign_sub(variable, tf.cast(learning_rate, variable.dtype) * ratio * update)

    def get_config(self):
        return {
            **super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
            "weight_decay_rate": self.weight_decay_rate,
        }
