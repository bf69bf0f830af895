"""The layers the models share: MLPs, interactions, cross networks, FM, crossed ids."""
