"""The saved state every recommender shares: its vocabularies and the items' popularity.

A model is saved as safetensors (``to_tensors``) and rebuilt on a device (``from_tensors``).
The vocabularies travel with the weights so external ids survive a reload, and popularity
ranks the users the model has no history for; each model adds its own weights beside them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from inference.recs.sparse import Vocabulary

if TYPE_CHECKING:
    import torch


class Catalogue(TypedDict):
    """The fields every recommender rebuilds from the same saved tensors."""

    users: Vocabulary
    items: Vocabulary
    popularity: torch.Tensor


def catalogue_tensors(
    users: Vocabulary, items: Vocabulary, popularity: torch.Tensor, **weights: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The tensors to save: ids, the model's ``weights`` in fp32 on the CPU, popularity."""
    import torch

    return {
        "user_ids": torch.from_numpy(users.ids),
        "item_ids": torch.from_numpy(items.ids),
        **{name: weight.float().cpu() for name, weight in weights.items()},
        "item_popularity": popularity.float().cpu(),
    }


def catalogue_from_tensors(tensors: dict[str, torch.Tensor], device: torch.device) -> Catalogue:
    """The vocabularies and popularity (fp32 on ``device``) of a saved model."""
    import torch

    return Catalogue(
        users=Vocabulary(tensors["user_ids"].numpy()),
        items=Vocabulary(tensors["item_ids"].numpy()),
        popularity=tensors["item_popularity"].to(device, torch.float32),
    )
