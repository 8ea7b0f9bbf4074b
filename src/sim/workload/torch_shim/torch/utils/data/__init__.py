from torch.utils.data.dataloader import DataLoader, Dataset

__all__ = ["DataLoader", "Dataset"]
