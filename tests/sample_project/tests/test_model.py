import numpy as np
from keras.models import load_model
from keras.utils import to_categorical

from digits.model import train


def make_data(n=640):
    rng = np.random.RandomState(0)
    x = rng.normal(size=(n, 20)).astype('float32')
    labels = (x[:, 0] + x[:, 1] > 0).astype(int) + 2 * (x[:, 2] > 0.5).astype(int)
    return x, to_categorical(labels, 4)


def test_it_learns_and_the_saved_model_predicts_the_same(tmp_path):
    x, y = make_data()
    model, history = train(x, y, str(tmp_path / 'digits.h5'))
    assert history.history['accuracy'][-1] > 0.9
    loaded = load_model(str(tmp_path / 'digits.h5'))
    np.testing.assert_allclose(loaded.predict(x[:32]), model.predict(x[:32]), atol=1e-5)
